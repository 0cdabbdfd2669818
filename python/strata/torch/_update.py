# SPDX-License-Identifier: Apache-2.0
"""Update: one optimizer step over a list of parameters, in order.

Each item is a parameter, its ParamState, its gradient and its group's
hyperparameters as they were when step() was called. For each item the
update
  1. (NVMe home) has prefetched the state `depth` items ahead,
  2. pins the state's host copy (master, exp_avg, exp_avg_sq),
  3. runs strata's CPU Adam on it with the new parameter values written
     straight into the parameter (a CPU tensor, in place) or, for a CUDA
     parameter, chunk by chunk through CudaStaging: gradient chunks are
     copied down ahead of the CPU (up to `buffers` chunks in flight), new
     values copied up behind it,
  4. releases the state dirty, (NVMe home) evicts the host copy, which
     writes it back, and marks the parameter ready: state.ready is set and,
     for a CUDA parameter, state.cuda_event follows its last upload.
The first error stops the update; it is kept in `error`, and every
parameter is marked ready so that nobody waits forever (the optimizer
raises the error instead: offload_adam.py).

run() does it on the calling thread; start() on a thread of its own, and
join() waits for it.
"""

import collections
import threading
import time

import torch

Item = collections.namedtuple("Item", "param state grad hyper")


class Update:
    def __init__(self, items, adam, home_is_nvme, depth, grad_scale, staging_for, start_events):
        self.items = items
        self.error = None
        self.seconds = 0.0
        self._adam = adam
        self._nvme = home_is_nvme
        self._depth = max(1, depth)
        self._grad_scale = grad_scale
        self._staging_for = staging_for    # device -> CudaStaging
        self._start_events = start_events  # device -> event recorded on its current stream at step()
        self._started = set()              # devices whose side streams wait for their start event
        self._thread = None
        for it in items:
            it.state.ready.clear()

    def start(self):
        self._thread = threading.Thread(target=self.run, name="strata-offload-adam", daemon=True)
        self._thread.start()

    def join(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def devices(self):
        return list(self._start_events)

    def run(self):
        t0 = time.perf_counter()
        try:
            with torch.no_grad():
                self._run()
        except BaseException as e:  # kept for the optimizer's next call; a thread has nobody to raise to
            self.error = e
        finally:
            for it in self.items:
                it.state.ready.set()
            self.seconds = time.perf_counter() - t0

    # ---- the pass -----------------------------------------------------------

    def _run(self):
        # Chunks: a CPU parameter is one, a CUDA one as many as its staging
        # buffers need. Chunk j's gradient is copied down before the CPU
        # reaches it, up to `window` chunks ahead.
        chunks = []
        for it in self.items:
            n = it.state.numel
            size = n
            if it.param.is_cuda:
                size = self._staging_for[it.param.device].chunk_elems(it.grad.dtype, it.param.dtype)
            chunks.append([(a, min(n, a + size)) for a in range(0, n, size)])
        flat = [(i, a, b) for i, cs in enumerate(chunks) for a, b in cs]
        window = max([s.buffers for s in self._staging_for.values()] + [1])
        downloads = {}  # flat chunk index -> (buffer, event, host gradient)
        prefetched = {}  # item index -> ticket (NVMe home)
        evictions = collections.deque()
        j = 0
        for i, it in enumerate(self.items):
            if self._nvme:
                for k in range(i, min(len(self.items), i + self._depth + 1)):
                    if k not in prefetched:
                        prefetched[k] = self.items[k].state.tensor.prefetch("host")
                del prefetched[i]  # the acquire below waits for it and reports its error
            with it.state.host("read_write") as (master, exp_avg, exp_avg_sq):
                for a, b in chunks[i]:
                    for ahead in range(j, min(len(flat), j + window)):
                        if ahead not in downloads and self.items[flat[ahead][0]].param.is_cuda:
                            downloads[ahead] = self._download(flat[ahead])
                    if it.param.is_cuda:
                        self._step_cuda(it, a, b, master, exp_avg, exp_avg_sq, downloads.pop(j))
                    else:
                        self._adam_step(it, master, exp_avg, exp_avg_sq, it.grad.reshape(-1),
                                        it.param.data.reshape(-1))
                    j += 1
            if self._nvme:
                evictions.append(it.state.tensor.evict("host"))  # written back to NVMe
                while len(evictions) > self._depth:
                    evictions.popleft().wait()
            it.state.ready.set()
        while evictions:
            evictions.popleft().wait()

    def _adam_step(self, it, master, exp_avg, exp_avg_sq, grad, param_out):
        h = it.hyper
        b1, b2 = h["betas"]
        self._adam.step(master, exp_avg, exp_avg_sq, grad, step=it.state.step, lr=float(h["lr"]),
                        betas=(float(b1), float(b2)), eps=float(h["eps"]), weight_decay=float(h["weight_decay"]),
                        decay="decoupled" if h["adamw_mode"] else "l2", bias_correction=h["bias_correction"],
                        grad_scale=self._grad_scale, param_out=param_out)

    # ---- CUDA parameters --------------------------------------------------

    def _side_streams(self, device):
        st = self._staging_for[device]
        if device not in self._started:
            # Nothing on the side streams may start before the backward that
            # made the gradients, nor overwrite a parameter it still reads.
            st.d2h.wait_event(self._start_events[device])
            st.h2d.wait_event(self._start_events[device])
            self._started.add(device)
        return st

    def _download(self, chunk):
        i, a, b = chunk
        it = self.items[i]
        st = self._side_streams(it.param.device)
        k = st.take()
        host = st.grad_buffer(k, b - a, it.grad.dtype)
        with torch.cuda.device(it.param.device), torch.cuda.stream(st.d2h):
            host.copy_(it.grad.reshape(-1)[a:b], non_blocking=True)
            done = torch.cuda.Event(blocking=True)  # the CPU waits on it: let it sleep, not spin
            done.record(st.d2h)
        return k, done, host

    def _step_cuda(self, it, a, b, master, exp_avg, exp_avg_sq, download):
        k, downloaded, grad = download
        st = self._staging_for[it.param.device]
        downloaded.synchronize()
        st.wait_out_free(k)
        out = st.out_buffer(k, b - a, it.param.dtype)
        self._adam_step(it, master[a:b], exp_avg[a:b], exp_avg_sq[a:b], grad, out)
        with torch.cuda.device(it.param.device), torch.cuda.stream(st.h2d):
            it.param.data.reshape(-1)[a:b].copy_(out, non_blocking=True)
            uploaded = torch.cuda.Event(blocking=True)
            uploaded.record(st.h2d)
        st.uploaded(k, uploaded)
        if b == it.state.numel:
            it.state.cuda_event = uploaded
