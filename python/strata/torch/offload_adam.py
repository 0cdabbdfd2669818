# SPDX-License-Identifier: Apache-2.0
"""OffloadAdam: a torch.optim.Optimizer whose fp32 master weights and
Adam/AdamW moments live in a strata TierStore (host memory, or NVMe with
`nvme_dirs`), updated by strata's SIMD CPU Adam, which writes the new
parameter values straight into the model's parameters (fp32, or the fused
fp16/bf16 copy-out).

    opt = strata.torch.OffloadAdam(model.parameters(), lr=3e-4, weight_decay=0.1)
    opt.overlap_with(model)      # optional: hide the update behind the next forward
    for x, y in batches:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()               # or opt.step(grad_scale=clip coefficient)
        opt.zero_grad()

Parameters may be CPU tensors (used in place: zero-copy through their
data_ptr) or CUDA tensors (gradients copied down and new values copied up
through pinned buffers on side streams, chunk by chunk, overlapping the
CPU). The defaults and results are torch.optim.AdamW's (adamw_mode=False:
torch.optim.Adam's L2 decay); the fp32 master is the truth, so bf16/fp16
parameters keep full-precision training. The state of a parameter is made
at its first step, from its value then.

Overlap (opt-in): after overlap_with(model), step() queues the update and
returns at once; a forward pre-hook on every module that holds parameters
waits for those parameters only (and, for CUDA ones, makes the current
stream wait for their upload), so the update of the later layers runs
while the forward computes the first ones. The update runs in the order the
last forward first used the parameters. Parameters a module's forward uses
but does not hold (a parent calling F.linear(x, child.weight)) are not
waited for: call synchronize() first. zero_grad(set_to_none=False),
state_dict(), load_state_dict(), the next step() and synchronize() wait for
the update.

Gradient clipping: step(grad_scale=c) multiplies every gradient by c in the
update itself (no pass over the gradients); grad_norm() gives the global L2
norm, so clipping to max_norm is
    opt.step(grad_scale=strata.clip_coefficient(opt.grad_norm(), max_norm))
the coefficient of torch.nn.utils.clip_grad_norm_.

Checkpoints: state_dict() holds, per parameter, "step", "exp_avg",
"exp_avg_sq" (torch.optim.AdamW's keys, CPU tensors of the parameter's
shape) and "master" (fp32), so torch.save/torch.load and load_state_dict
round-trip; a torch.optim.AdamW state_dict loads too (the master is then the
parameter's value).

Errors: bad options raise at construction; a failure during an update
(in the background too) is raised by the next call, and every call after it
raises FailedPreconditionError: the state may be half updated.

Thread-safety: one thread drives the optimizer (as any torch optimizer);
the update runs on a thread of its own with overlap.
"""

import math

import torch

from .. import adam as _adam
from .. import errors
from .. import store as _store
from ._staging import CudaStaging
from ._state import PARAM_DTYPES, STATE_DTYPES, ParamState
from ._update import Item, Update

_ALIGN = 4096  # the host tier's block alignment (tiers/host_tier.h)
_STAGING_CHUNK = 1 << 20  # the store's own staging: it moves no GPU data here


def _round_up(x, a):
    return (x + a - 1) // a * a


class OffloadAdam(torch.optim.Optimizer):
    """Adam/AdamW with its state in a strata TierStore (see the module doc).

    lr, betas, eps, weight_decay, adamw_mode (True: decoupled decay as
    AdamW, False: L2 as Adam), bias_correction: per parameter group.
    nvme_dirs: directories for the state's home (empty: host memory).
    state_dtype: "f32" or "bf16" moments (the master is always fp32).
    threads, isa: the CPU Adam's (0: all hardware threads; "auto").
    prefetch_depth: parameters whose NVMe state is read ahead.
    staging_buffers, staging_bytes: the pinned chunks for CUDA parameters
    (per device: 2 x buffers x bytes of pinned memory).
    store_options: TierStore options (strata.TierStore) over the defaults
    chosen here (host budget sized for the state, pageable memory, no gpu
    tier); e.g. {"nvme_buffered_fallback": True} where O_DIRECT is refused.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, adamw_mode=True,
                 bias_correction=True, nvme_dirs=(), state_dtype="f32", threads=0, isa="auto", prefetch_depth=2,
                 staging_buffers=4, staging_bytes=32 << 20, store_options=None):
        if state_dtype not in STATE_DTYPES:
            raise ValueError("OffloadAdam: state_dtype %r is not one of %s" % (state_dtype, ", ".join(STATE_DTYPES)))
        if staging_buffers < 2 or staging_bytes < 4096:
            raise ValueError("OffloadAdam: staging_buffers must be >= 2 and staging_bytes >= 4096 (got %d, %d)"
                             % (staging_buffers, staging_bytes))
        if prefetch_depth < 1:
            raise ValueError("OffloadAdam: prefetch_depth must be >= 1 (got %d)" % prefetch_depth)
        _check_hyper(lr, betas, eps, weight_decay, where="OffloadAdam")
        if isinstance(nvme_dirs, (str, bytes)):
            nvme_dirs = [nvme_dirs]
        self._state_dtype = state_dtype
        self._states = {}  # parameter -> ParamState, in parameter-group order
        self._store = None  # opened at the first step or load (it is sized for every parameter then)
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, adamw_mode=adamw_mode,
                        bias_correction=bias_correction)
        super().__init__(params, defaults)
        self._nvme_dirs = list(nvme_dirs)
        self._depth = prefetch_depth
        self._staging_args = (staging_buffers, staging_bytes)
        self._staging = {}  # torch.device -> CudaStaging
        self._store_options = dict(store_options or {})
        self._adam = _adam.CpuAdam(threads=threads, isa=isa)
        self._update = None  # the update in flight (with overlap)
        self._error = None  # the first update failure; sticky
        self._overlap = False
        self._hooks = []
        self._use_order = []  # states in the order the forward first used them since the last step
        self._used = set()
        self.last_update_seconds = 0.0  # wall time of the last finished update

    # ---- torch.optim.Optimizer ---------------------------------------------

    def add_param_group(self, param_group):
        if getattr(self, "_store", None) is not None:
            raise errors.FailedPreconditionError(
                "OffloadAdam: add_param_group after the first step or load: the tier store is already sized")
        super().add_param_group(param_group)
        for p in self.param_groups[-1]["params"]:
            self._states[p] = ParamState(len(self._states), p, self._state_dtype)

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale=1.0):
        """One update of every parameter that has a gradient. grad_scale
        multiplies the gradients (finite, >= 0: a clip coefficient, 1/loss
        scale). With overlap it returns once the update is queued."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.synchronize()
        if not (math.isfinite(grad_scale) and grad_scale >= 0):
            raise errors.InvalidArgumentError("OffloadAdam.step: grad_scale %r is not finite and >= 0" % (grad_scale,))
        update = self._plan(float(grad_scale))
        if self._overlap:
            self._update = update
            update.start()
        else:
            update.run()
            self._finish(update)
        return loss

    def zero_grad(self, set_to_none=True):
        """As torch's. set_to_none=False zeroes the gradients in place, so it
        first waits for an update in flight (which reads them)."""
        if not set_to_none:
            self.synchronize()
        super().zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        self.synchronize()
        home_nvme = bool(self._nvme_dirs)
        state, groups, index = {}, [], 0
        for g in self.param_groups:
            packed = {k: v for k, v in g.items() if k != "params"}
            packed["params"] = []
            for p in g["params"]:
                s = self._states[p]
                if s.created:
                    master, exp_avg, exp_avg_sq = s.read(home_nvme)
                    state[index] = {"step": torch.tensor(float(s.step)), "exp_avg": exp_avg,
                                    "exp_avg_sq": exp_avg_sq, "master": master}
                packed["params"].append(index)
                index += 1
            groups.append(packed)
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        self.synchronize()
        groups = state_dict["param_groups"]
        if len(groups) != len(self.param_groups):
            raise ValueError("OffloadAdam.load_state_dict: %d parameter groups saved, the optimizer has %d"
                             % (len(groups), len(self.param_groups)))
        by_id = {}
        for n, (g, saved) in enumerate(zip(self.param_groups, groups)):
            if len(saved["params"]) != len(g["params"]):
                raise ValueError("OffloadAdam.load_state_dict: group %d saved %d parameters, the optimizer has %d"
                                 % (n, len(saved["params"]), len(g["params"])))
            for flag in ("amsgrad", "maximize"):
                if saved.get(flag):
                    raise ValueError("OffloadAdam.load_state_dict: group %d was saved with %s=True, "
                                     "which OffloadAdam does not implement" % (n, flag))
            by_id.update(zip(saved["params"], g["params"]))
        saved_state = state_dict["state"]
        for pid, p in by_id.items():  # checked before anything changes
            st = saved_state.get(pid)
            if st is None:
                continue
            n = self._states[p].numel
            for key in ("master", "exp_avg", "exp_avg_sq"):
                if key in st and st[key].numel() != n:
                    raise ValueError("OffloadAdam.load_state_dict: %s of parameter %s holds %d values, "
                                     "the parameter %d" % (key, pid, st[key].numel(), n))
        for g, saved in zip(self.param_groups, groups):
            for k, v in saved.items():
                if k != "params":
                    g[k] = tuple(v) if k == "betas" else v
        self._open_store()
        home = "nvme" if self._nvme_dirs else "host"
        for pid, p in by_id.items():
            s = self._states[p]
            st = saved_state.get(pid)
            if st is None:  # as torch's: a parameter without saved state starts afresh
                s.remove()
                continue
            if not s.created:
                s.create(self._store, home)
            # without a saved master (a torch.optim.AdamW state_dict): the parameter's value
            s.write(st.get("master", p), st["exp_avg"], st["exp_avg_sq"], home == "nvme")
            s.step = int(st["step"])

    # ---- strata's own --------------------------------------------------------

    def overlap_with(self, module):
        """Opts in to the overlapped update: step() returns once the update
        is queued and each module of `module` waits, before its forward,
        for the parameters it holds. Every parameter of this optimizer must
        be held by a module of `module`. Returns a handle whose remove()
        turns it off again."""
        if self._overlap:
            raise errors.FailedPreconditionError("OffloadAdam.overlap_with: already on (remove() its handle first)")
        held = {}
        for m in module.modules():
            own = [self._states[p] for p in m.parameters(recurse=False) if p in self._states]
            if own:
                held.update((id(s), s) for s in own)
                self._hooks.append(m.register_forward_pre_hook(_WaitHook(self, own)))
        missing = [s for s in self._states.values() if id(s) not in held]
        if missing:
            for h in self._hooks:
                h.remove()
            self._hooks = []
            raise ValueError("OffloadAdam.overlap_with: %d parameters of the optimizer are not held by a module "
                             "of %s (the first: parameter %d, shape %s)"
                             % (len(missing), type(module).__name__, missing[0].index, missing[0].shape))
        self._overlap = True
        return _OverlapHandle(self)

    def synchronize(self):
        """Waits for the update in flight, if any; raises its error."""
        if self._error is not None:
            raise errors.FailedPreconditionError(
                "OffloadAdam: an earlier update failed (%s); the optimizer state may be half updated: "
                "load a checkpoint" % (self._error,)) from self._error
        update, self._update = self._update, None
        if update is not None:
            update.join()
            self._finish(update)

    def grad_norm(self):
        """The global L2 norm of the gradients (inf when one is not finite):
        the sum of squares in fp64, CPU gradients by strata's scan, CUDA ones
        by torch in fp32 per tensor."""
        sum_sq, nonfinite, cuda_norms = 0.0, 0, []
        for p in self._states:
            g = p.grad
            if g is None:
                continue
            if g.is_cuda:
                cuda_norms.append(torch.linalg.vector_norm(g, 2, dtype=torch.float32))
            else:
                stats = self._adam.grad_stats(g.contiguous())
                sum_sq += stats.sum_sq
                nonfinite += stats.nonfinite
        if cuda_norms:  # one copy down (per device), not one per gradient
            for device in {n.device for n in cuda_norms}:
                norms = torch.stack([n for n in cuda_norms if n.device == device]).to("cpu", torch.float64)
                sum_sq += float((norms * norms).sum())
        return math.inf if nonfinite else math.sqrt(sum_sq)

    @property
    def store(self):
        """The TierStore holding the state (None before the first step)."""
        return self._store

    def close(self):
        """Waits for the update in flight and frees the store and the CPU Adam."""
        try:
            self.synchronize()
        finally:
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if self._store is not None:
                self._store.close()
            self._adam.close()

    # ---- internals --------------------------------------------------------

    def _open_store(self):
        if self._store is not None:
            return
        staging = 2 * _STAGING_CHUNK
        sizes = [_round_up(s.nbytes, _ALIGN) for s in self._states.values() if s.numel]
        if self._nvme_dirs:
            # a window: the parameters prefetched ahead, the one updated, those being written back
            budget = staging + 2 * (self._depth + 2) * max(sizes + [_ALIGN])
        else:
            budget = staging + sum(sizes) + _ALIGN
        options = dict(gpu=False, host_budget_bytes=budget, host_slab_bytes=0, host_pin=False,
                       staging_chunk_bytes=_STAGING_CHUNK, staging_buffers=2, staging_per_move=2)
        options.update(self._store_options)
        self._store = _store.TierStore(nvme_dirs=self._nvme_dirs, **options)

    def _plan(self, grad_scale):
        """The update of this step: the parameters with a gradient, in the
        order the last forward used them (then the rest in group order),
        each with its group's hyperparameters as they are now."""
        self._open_store()
        group_of = {}
        for g in self.param_groups:
            _check_hyper(g["lr"], g["betas"], g["eps"], g["weight_decay"], where="OffloadAdam parameter group")
            hyper = {k: v for k, v in g.items() if k != "params"}
            group_of.update((p, hyper) for p in g["params"])
        by_state = {id(s): p for p, s in self._states.items()}
        order = [by_state[id(s)] for s in self._use_order]
        order += [p for p, s in self._states.items() if id(s) not in self._used]
        self._use_order, self._used = [], set()
        todo = []  # every gradient is checked before any state changes
        for p in order:
            g = p.grad
            s = self._states[p]
            if g is None or s.numel == 0:
                continue
            if g.is_sparse:
                raise errors.InvalidArgumentError("OffloadAdam: parameter %d has a sparse gradient" % s.index)
            if g.dtype not in PARAM_DTYPES or g.device != p.device or g.numel() != s.numel:
                raise errors.InvalidArgumentError(
                    "OffloadAdam: the gradient of parameter %d is %s %s of %d values; the parameter is %s %s of %d"
                    % (s.index, g.device, g.dtype, g.numel(), p.device, p.dtype, s.numel))
            todo.append((p, s, g.contiguous()))
        home = "nvme" if self._nvme_dirs else "host"
        items, start_events = [], {}
        for p, s, g in todo:
            if not s.created:
                s.create(self._store, home)
                s.write(p, None, None, home == "nvme")  # the master from the parameter's value now
            if p.is_cuda:
                if p.device not in self._staging:
                    self._staging[p.device] = CudaStaging(p.device, *self._staging_args)
                if p.device not in start_events:
                    start_events[p.device] = torch.cuda.Event()
                    start_events[p.device].record(torch.cuda.current_stream(p.device))
                st = self._staging[p.device]
                g.record_stream(st.d2h)  # the allocator keeps it until the copy down has run
                p.data.record_stream(st.h2d)
            s.step += 1
            items.append(Item(p, s, g, group_of[p]))
        return Update(items, self._adam, home == "nvme", self._depth, grad_scale, self._staging, start_events)

    def _finish(self, update):
        """After an update: its error becomes sticky; the current stream of
        each device waits for the uploads (work queued after this sees the
        new parameters)."""
        self.last_update_seconds = update.seconds
        if update.error is not None:
            self._error = update.error
            raise update.error
        for device in update.devices():
            torch.cuda.current_stream(device).wait_stream(self._staging[device].h2d)

    def _before_forward(self, states):
        if self._overlap:
            for s in states:
                if id(s) not in self._used:
                    self._used.add(id(s))
                    self._use_order.append(s)
        update = self._update
        if update is None:
            return
        for s in states:
            s.ready.wait()
            if update.error is not None:
                self.synchronize()  # raises it
            if s.cuda_event is not None:
                torch.cuda.current_stream(s.device).wait_event(s.cuda_event)


def _check_hyper(lr, betas, eps, weight_decay, where):
    b1, b2 = betas
    for name, v, ok in (("lr", lr, lr >= 0), ("beta1", b1, 0 <= b1 < 1), ("beta2", b2, 0 <= b2 < 1),
                        ("eps", eps, eps >= 0), ("weight_decay", weight_decay, weight_decay >= 0)):
        if not (math.isfinite(v) and ok):
            raise ValueError("%s: %s %r is out of range (lr, eps, weight_decay >= 0; 0 <= betas < 1)"
                             % (where, name, v))


class _WaitHook:
    """The forward pre-hook of one module: waits for the parameters it holds."""

    def __init__(self, opt, states):
        self._opt = opt
        self._states = states

    def __call__(self, module, args):
        self._opt._before_forward(self._states)


class _OverlapHandle:
    def __init__(self, opt):
        self._opt = opt

    def remove(self):
        """Waits for the update in flight, then steps synchronously again."""
        opt = self._opt
        opt.synchronize()
        for h in opt._hooks:
            h.remove()
        opt._hooks = []
        opt._overlap = False
