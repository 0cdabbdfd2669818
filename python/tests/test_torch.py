# SPDX-License-Identifier: Apache-2.0
"""strata.torch.OffloadAdam on CPU parameters against torch.optim.AdamW/Adam.

Two copies of a small model take the same steps on the same data, one with
torch's optimizer and one with OffloadAdam (its state in a tier store on
the host, or on NVMe: a directory of the test's own); after 100 steps the
parameters agree within fp32 tolerance (the update's operations are
DeepSpeed's fma sequence, not torch's, so the last bits differ and the
trajectories drift apart by a few ulps). The overlapped update, the NVMe
home and a state_dict round trip must give the same bits as the plain run.

Skipped, with the reason, where torch cannot be imported (the CTest test
runs these under a Python that has it: python/tests/python_with.sh).
"""

import copy
import io
import math
import os
import shutil
import tempfile
import unittest

try:
    import torch
except ImportError as e:
    torch = None
    TORCH_MISSING = str(e)

import strata

if torch is not None:
    import strata.torch as st

STEPS = 100
TOL = dict(rtol=1e-5, atol=1e-5)  # fp32: ~100 ulps of the parameters' size after 100 steps


def make_model(seed=0, dtype=None):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(24, 48), torch.nn.LayerNorm(48), torch.nn.GELU(),
                            torch.nn.Linear(48, 48), torch.nn.GELU(), torch.nn.Linear(48, 5))
    return m.to(dtype) if dtype is not None else m


def batches(n, seed=1):
    """n batches of a fixed linear teacher's inputs and outputs (the loss can fall)."""
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(24, 5, generator=g) / 5
    out = []
    for _ in range(n):
        x = torch.randn(32, 24, generator=g)
        out.append((x, x @ teacher))
    return out


def train(model, opt, data, clip=None):
    """The plain loop. clip: OffloadAdam gets grad_scale from its own norm,
    a torch optimizer clip_grad_norm_; returns the losses."""
    losses = []
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
        loss.backward()
        if clip is None:
            opt.step()
        elif isinstance(opt, st.OffloadAdam):
            opt.step(grad_scale=strata.clip_coefficient(opt.grad_norm(), clip))
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    if isinstance(opt, st.OffloadAdam):
        opt.synchronize()
    return losses


def assert_params_close(test, a, b, **tol):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), msg=lambda m: "%s: %s" % (name, m), **(tol or TOL))


def assert_params_equal(test, a, b):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        test.assertTrue(torch.equal(p, q), "%s differs: max |diff| %g" % (name, (p - q).abs().max().item()))


@unittest.skipIf(torch is None, "torch is not importable: %s" % (TORCH_MISSING if torch is None else ""))
class OffloadAdamTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="strata-torch-test-", dir=os.environ.get("TMPDIR", "/var/tmp"))
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.opts = []

    def tearDown(self):
        for o in self.opts:
            o.close()

    def offload(self, params, nvme=False, **kw):
        if nvme:
            kw.update(nvme_dirs=[self.dir], store_options={"nvme_buffered_fallback": True})
        o = st.OffloadAdam(params, threads=2, **kw)
        self.opts.append(o)
        return o

    # ---- against torch ------------------------------------------------------

    def test_host_state_gives_adamw_parameters(self):
        a, b = make_model(), make_model()
        data = batches(STEPS)
        train(a, torch.optim.AdamW(a.parameters(), lr=3e-3, weight_decay=0.1), data)
        opt = self.offload(b.parameters(), lr=3e-3, weight_decay=0.1)
        train(b, opt, data)
        assert_params_close(self, a, b)
        self.assertEqual(opt.store.stats()["tiers"].keys(), {"host"})

    def test_nvme_state_gives_adamw_parameters_and_streams_through_nvme(self):
        a, b = make_model(), make_model()
        data = batches(STEPS)
        train(a, torch.optim.AdamW(a.parameters(), lr=3e-3, weight_decay=0.1), data)
        opt = self.offload(b.parameters(), nvme=True, lr=3e-3, weight_decay=0.1)
        train(b, opt, data)
        assert_params_close(self, a, b)
        state_bytes = sum(p.numel() * 12 for p in b.parameters())
        stats = opt.store.stats()
        # every step reads the whole state from its NVMe home and writes it back
        self.assertGreaterEqual(stats["links"]["nvme_to_host"]["bytes"], (STEPS - 1) * state_bytes)
        self.assertGreaterEqual(stats["links"]["host_to_nvme"]["bytes"], STEPS * state_bytes)
        self.assertTrue(os.listdir(self.dir), "no swap file in the NVMe directory")

    def test_nvme_and_host_homes_give_the_same_bits(self):
        a, b = make_model(), make_model()
        data = batches(20)
        train(a, self.offload(a.parameters(), lr=3e-3), data)
        train(b, self.offload(b.parameters(), nvme=True, lr=3e-3), data)
        assert_params_equal(self, a, b)

    def test_adam_mode_gives_adam_with_l2_decay(self):
        a, b = make_model(), make_model()
        data = batches(STEPS)
        train(a, torch.optim.Adam(a.parameters(), lr=3e-3, weight_decay=0.05), data)
        train(b, self.offload(b.parameters(), lr=3e-3, weight_decay=0.05, adamw_mode=False), data)
        assert_params_close(self, a, b)

    def test_param_groups_keep_their_hyperparameters(self):
        a, b = make_model(), make_model()

        def groups(m):
            return [{"params": m[0].parameters(), "lr": 1e-2, "weight_decay": 0.2},
                    {"params": list(m[1].parameters()) + list(m[3].parameters()) + list(m[5].parameters()),
                     "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.0}]

        data = batches(STEPS)
        train(a, torch.optim.AdamW(groups(a), lr=3e-3), data)
        opt = self.offload(groups(b), lr=3e-3)
        self.assertEqual(opt.param_groups[0]["lr"], 1e-2)
        self.assertEqual(opt.param_groups[1]["betas"], (0.8, 0.95))
        train(b, opt, data)
        assert_params_close(self, a, b)

    def test_lr_scheduler_drives_the_group_lr(self):
        a, b = make_model(), make_model()
        data = batches(30)
        oa = torch.optim.AdamW(a.parameters(), lr=1e-2)
        ob = self.offload(b.parameters(), lr=1e-2)
        for m, o in ((a, oa), (b, ob)):
            sched = torch.optim.lr_scheduler.StepLR(o, step_size=5, gamma=0.5)
            for x, y in data:
                torch.nn.functional.mse_loss(m(x), y).backward()
                o.step()
                o.zero_grad()
                sched.step()
        self.assertAlmostEqual(ob.param_groups[0]["lr"], 1e-2 * 0.5 ** 6)
        assert_params_close(self, a, b)

    def test_clipping_by_multiplier_gives_clip_grad_norm(self):
        a, b = make_model(), make_model()
        data = batches(STEPS)
        # the norms of this model's gradients are ~1-3: 0.5 clips most steps
        train(a, torch.optim.AdamW(a.parameters(), lr=3e-3), data, clip=0.5)
        train(b, self.offload(b.parameters(), lr=3e-3), data, clip=0.5)
        assert_params_close(self, a, b)

    def test_grad_norm_is_the_global_norm(self):
        m = make_model()
        opt = self.offload(m.parameters())
        x, y = batches(1)[0]
        torch.nn.functional.mse_loss(m(x), y).backward()
        want = torch.nn.utils.clip_grad_norm_(m.parameters(), math.inf).item()
        self.assertAlmostEqual(opt.grad_norm(), want, delta=1e-5 * want)
        next(m.parameters()).grad[0, 0] = float("nan")
        self.assertEqual(opt.grad_norm(), math.inf)

    def test_grad_scale_multiplies_the_gradients(self):
        a, b = make_model(), make_model()
        data = batches(10)
        oa = self.offload(a.parameters(), lr=3e-3)
        ob = self.offload(b.parameters(), lr=3e-3)
        for x, y in data:
            torch.nn.functional.mse_loss(a(x), y).backward()
            oa.step(grad_scale=0.25)
            oa.zero_grad()
            (0.25 * torch.nn.functional.mse_loss(b(x), y)).backward()
            ob.step()
            ob.zero_grad()
        assert_params_close(self, a, b, rtol=1e-6, atol=1e-6)

    # ---- half parameters: the fused copy-out ------------------------------

    def test_half_parameters_are_the_rounded_fp32_masters(self):
        # The gradients are made up (half on the CPU has no matmul in every
        # torch), the same half values for both: what is checked is the update.
        for dtype in (torch.bfloat16, torch.float16):
            with self.subTest(dtype=dtype):
                torch.manual_seed(3)
                params = [torch.nn.Parameter((0.1 * torch.randn(*shape)).to(dtype))
                          for shape in ((48, 24), (48,), (5, 48), (2, 3, 7))]
                ref = [p.detach().float().clone().requires_grad_() for p in params]
                ref_opt = torch.optim.AdamW(ref, lr=3e-3, weight_decay=0.1)
                opt = self.offload(params, lr=3e-3, weight_decay=0.1)
                for _ in range(30):
                    for r, p in zip(ref, params):
                        p.grad = torch.randn(p.shape).to(dtype)
                        r.grad = p.grad.float()
                    opt.step()
                    ref_opt.step()
                masters = opt.state_dict()["state"]
                for i, (r, p) in enumerate(zip(ref, params)):
                    master = masters[i]["master"]
                    self.assertEqual(master.dtype, torch.float32)
                    torch.testing.assert_close(master, r.detach(), **TOL)
                    self.assertTrue(torch.equal(p.detach(), master.to(dtype)),
                                    "parameter %d is not its master rounded to %s" % (i, dtype))

    def test_bf16_moments_train_the_model(self):
        a, b = make_model(), make_model()
        data = batches(STEPS)
        la = train(a, self.offload(a.parameters(), lr=3e-3), data)
        lb = train(b, self.offload(b.parameters(), lr=3e-3, state_dtype="bf16"), data)
        self.assertLess(lb[-1], 0.5 * lb[0])
        self.assertAlmostEqual(la[-1], lb[-1], delta=0.05 * la[-1])

    # ---- checkpoints ---------------------------------------------------------

    def round_trip(self, nvme):
        a = make_model()
        data = batches(20)
        opt = self.offload(a.parameters(), nvme=nvme, lr=3e-3, weight_decay=0.1)
        train(a, opt, data[:10])
        buf = io.BytesIO()
        torch.save({"model": a.state_dict(), "opt": opt.state_dict()}, buf)
        train(a, opt, data[10:])

        b = make_model(seed=5)  # other weights and no state until loaded
        buf.seek(0)
        saved = torch.load(buf)
        b.load_state_dict(saved["model"])
        opt_b = self.offload(b.parameters(), nvme=nvme, lr=1.0)  # the saved groups' lr replaces it
        opt_b.load_state_dict(saved["opt"])
        self.assertEqual(opt_b.param_groups[0]["lr"], 3e-3)
        train(b, opt_b, data[10:])
        assert_params_equal(self, a, b)
        return saved["opt"]

    def test_state_dict_round_trips_through_torch_save(self):
        sd = self.round_trip(nvme=False)
        self.assertEqual(sorted(sd["state"][0]), ["exp_avg", "exp_avg_sq", "master", "step"])
        self.assertEqual(int(sd["state"][0]["step"]), 10)
        self.assertEqual(tuple(sd["state"][0]["exp_avg"].shape), (48, 24))

    def test_state_dict_round_trips_with_nvme_state(self):
        self.round_trip(nvme=True)

    def test_loads_a_torch_adamw_state_dict(self):
        a, b = make_model(), make_model()
        data = batches(20)
        oa = torch.optim.AdamW(a.parameters(), lr=3e-3, weight_decay=0.1)
        train(a, oa, data[:10])
        b.load_state_dict(a.state_dict())
        ob = self.offload(b.parameters(), lr=3e-3, weight_decay=0.1)
        ob.load_state_dict(oa.state_dict())
        train(a, oa, data[10:])
        train(b, ob, data[10:])
        assert_params_close(self, a, b)

    def test_load_state_dict_refuses_another_layout(self):
        a = make_model()
        opt = self.offload(a.parameters())
        sd = opt.state_dict()
        sd["param_groups"][0]["params"] = sd["param_groups"][0]["params"][:-1]
        with self.assertRaisesRegex(ValueError, "group 0 saved 7 parameters, the optimizer has 8"):
            opt.load_state_dict(sd)
        sd = torch.optim.AdamW(make_model().parameters(), amsgrad=True).state_dict()
        with self.assertRaisesRegex(ValueError, "amsgrad=True"):
            opt.load_state_dict(sd)

    # ---- the overlapped update --------------------------------------------

    def test_overlapped_update_gives_the_same_bits(self):
        for nvme in (False, True):
            with self.subTest(nvme=nvme):
                a, b = make_model(), make_model()
                data = batches(20)
                train(a, self.offload(a.parameters(), nvme=nvme, lr=3e-3), data)
                ob = self.offload(b.parameters(), nvme=nvme, lr=3e-3)
                ob.overlap_with(b)
                train(b, ob, data)
                assert_params_equal(self, a, b)

    def test_overlapped_step_returns_before_the_update_and_the_forward_waits(self):
        m = make_model()
        opt = self.offload(m.parameters(), lr=3e-3)
        opt.overlap_with(m)
        x, y = batches(1)[0]
        torch.nn.functional.mse_loss(m(x), y).backward()
        before = [p.detach().clone() for p in m.parameters()]
        opt.step()
        self.assertIsNotNone(opt._update, "step() ran the update itself")
        out = m(x)  # the hooks wait, layer by layer
        opt.synchronize()
        after = [p.detach().clone() for p in m.parameters()]
        self.assertTrue(all(not torch.equal(p, q) for p, q in zip(before, after)))
        self.assertTrue(torch.equal(out, m(x)), "the forward ran on parameters not yet updated")

    def test_overlapped_update_runs_in_forward_order(self):
        # A model whose modules are registered in the reverse of their use.
        class Reversed(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.last = torch.nn.Linear(8, 2)
                self.first = torch.nn.Linear(4, 8)

            def forward(self, x):
                return self.last(torch.relu(self.first(x)))

        m = Reversed()
        opt = self.offload(m.parameters())
        opt.overlap_with(m)
        m(torch.randn(3, 4)).sum().backward()
        opt.step()
        order = [it.param for it in opt._update.items]
        opt.synchronize()
        self.assertEqual([id(p) for p in order],
                         [id(p) for p in (m.first.weight, m.first.bias, m.last.weight, m.last.bias)])

    def test_overlap_needs_every_parameter_in_the_module(self):
        m = make_model()
        extra = torch.nn.Parameter(torch.zeros(3))
        opt = self.offload(list(m.parameters()) + [extra])
        with self.assertRaisesRegex(ValueError, "1 parameters of the optimizer are not held by a module"):
            opt.overlap_with(m)

    def test_zero_grad_in_place_waits_for_the_update(self):
        a, b = make_model(), make_model()
        data = batches(10)
        train(a, self.offload(a.parameters(), lr=3e-3), data)
        ob = self.offload(b.parameters(), lr=3e-3)
        ob.overlap_with(b)
        for x, y in data:
            torch.nn.functional.mse_loss(b(x), y).backward()
            ob.step()
            ob.zero_grad(set_to_none=False)  # zeroes the gradients the update reads: it must wait
        ob.synchronize()
        assert_params_equal(self, a, b)

    # ---- errors --------------------------------------------------------------

    def test_bad_input_is_named(self):
        with self.assertRaisesRegex(TypeError, "parameter 0 is torch.float64"):
            st.OffloadAdam([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))])
        with self.assertRaisesRegex(ValueError, "beta2 1.5 is out of range"):
            st.OffloadAdam(make_model().parameters(), betas=(0.9, 1.5))
        with self.assertRaisesRegex(ValueError, "state_dtype 'f16'"):
            st.OffloadAdam(make_model().parameters(), state_dtype="f16")
        m = make_model()
        opt = self.offload(m.parameters())
        x, y = batches(1)[0]
        torch.nn.functional.mse_loss(m(x), y).backward()
        with self.assertRaisesRegex(strata.InvalidArgumentError, "grad_scale nan"):
            opt.step(grad_scale=float("nan"))

    def test_a_failed_update_is_raised_and_sticks(self):
        for overlap in (False, True):
            with self.subTest(overlap=overlap):
                m = make_model()
                opt = st.OffloadAdam(m.parameters(), threads=1, nvme_dirs=[self.dir],
                                     store_options={"nvme_buffered_fallback": True})
                if overlap:
                    opt.overlap_with(m)
                x, y = batches(1)[0]
                torch.nn.functional.mse_loss(m(x), y).backward()
                opt.step()
                opt.synchronize()
                opt.store.close()  # the state is gone: the next update cannot read it
                with self.assertRaises(strata.FailedPreconditionError) as first:
                    opt.step()
                    opt.synchronize()
                self.assertIn("TierStore is closed", str(first.exception))
                with self.assertRaisesRegex(strata.FailedPreconditionError, "an earlier update failed"):
                    opt.step()


if __name__ == "__main__":
    unittest.main()
