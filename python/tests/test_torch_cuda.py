# SPDX-License-Identifier: Apache-2.0
"""strata.torch.OffloadAdam on CUDA parameters: gradients copied down and
new values copied up through pinned chunks on side streams (label gpu;
skipped with the reason without torch or a GPU).

The chunks are made small (staging_bytes 4 KiB, 2 buffers) so that every
parameter takes many chunks and every buffer is reused many times in a step.
"""

import os
import shutil
import sys
import tempfile
import unittest

try:
    import torch
    SKIP = None if torch.cuda.is_available() else "torch sees no CUDA device"
except ImportError as e:
    torch = None
    SKIP = "torch is not importable: %s" % e

if torch is not None:
    import strata.torch as st

SMALL_CHUNKS = dict(staging_bytes=4096, staging_buffers=2)
TOL = dict(rtol=1e-5, atol=1e-5)


def make_model(dtype):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 256),
                            torch.nn.LayerNorm(256), torch.nn.Linear(256, 8))
    return m.to("cuda", dtype)


def batches(n, dtype):
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(64, 8, generator=g) / 8
    out = []
    for _ in range(n):
        x = torch.randn(16, 64, generator=g)
        out.append((x.to("cuda", dtype), (x @ teacher).to("cuda", dtype)))
    return out


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x).float(), y.float())


@unittest.skipIf(SKIP is not None, SKIP or "")
class OffloadAdamCudaTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="strata-torch-cuda-", dir=os.environ.get("TMPDIR", "/var/tmp"))
        self.addCleanup(shutil.rmtree, self.dir, True)

    def offload(self, params, nvme=False, **kw):
        if nvme:
            kw.update(nvme_dirs=[self.dir], store_options={"nvme_buffered_fallback": True})
        opt = st.OffloadAdam(params, **SMALL_CHUNKS, **kw)
        self.addCleanup(opt.close)
        return opt

    def test_bf16_parameters_follow_fp32_adamw_on_their_gradients(self):
        for nvme in (False, True):
            with self.subTest(nvme=nvme):
                model = make_model(torch.bfloat16)
                ref = [p.detach().float().cpu().requires_grad_() for p in model.parameters()]
                ref_opt = torch.optim.AdamW(ref, lr=3e-3, weight_decay=0.1)
                opt = self.offload(model.parameters(), nvme=nvme, lr=3e-3, weight_decay=0.1)
                for x, y in batches(30, torch.bfloat16):
                    loss_of(model, x, y).backward()
                    for r, p in zip(ref, model.parameters()):
                        r.grad = p.grad.float().cpu()
                    opt.step()
                    opt.zero_grad()
                    ref_opt.step()
                state = opt.state_dict()["state"]
                for i, (r, p) in enumerate(zip(ref, model.parameters())):
                    torch.testing.assert_close(state[i]["master"], r.detach(), **TOL)
                    self.assertTrue(torch.equal(p.detach().cpu(), state[i]["master"].to(torch.bfloat16)),
                                    "parameter %d is not its master rounded to bf16" % i)

    def test_fp32_parameters_give_torch_adamw_on_the_gpu(self):
        a, b = make_model(torch.float32), make_model(torch.float32)
        oa = torch.optim.AdamW(a.parameters(), lr=3e-3, weight_decay=0.1)
        ob = self.offload(b.parameters(), lr=3e-3, weight_decay=0.1)
        for x, y in batches(50, torch.float32):
            for m, o in ((a, oa), (b, ob)):
                loss_of(m, x, y).backward()
                o.step()
                o.zero_grad()
        for p, q in zip(a.parameters(), b.parameters()):
            torch.testing.assert_close(q, p, **TOL)

    def test_overlapped_update_gives_the_same_bits(self):
        a, b = make_model(torch.bfloat16), make_model(torch.bfloat16)
        oa = self.offload(a.parameters(), lr=3e-3)
        ob = self.offload(b.parameters(), lr=3e-3)
        ob.overlap_with(b)
        for x, y in batches(20, torch.bfloat16):
            for m, o in ((a, oa), (b, ob)):
                loss_of(m, x, y).backward()
                o.step()
                o.zero_grad()
        ob.synchronize()
        for i, (p, q) in enumerate(zip(a.parameters(), b.parameters())):
            self.assertTrue(torch.equal(p, q), "parameter %d differs" % i)

    def test_the_next_forward_sees_the_update(self):
        # No synchronize: the hooks alone order the forward after the uploads.
        model = make_model(torch.bfloat16)
        opt = self.offload(model.parameters(), lr=1e-2)
        opt.overlap_with(model)
        x, y = batches(1, torch.bfloat16)[0]
        loss_of(model, x, y).backward()
        before = [p.detach().clone() for p in model.parameters()]
        opt.step()
        out = model(x)
        opt.synchronize()
        torch.cuda.synchronize()
        self.assertTrue(all(not torch.equal(p, q) for p, q in zip(before, model.parameters())))
        self.assertTrue(torch.equal(out, model(x)))


if __name__ == "__main__":
    if SKIP is not None:  # CTest reads 77 as skipped (tests/CMakeLists.txt)
        print("skipped: " + SKIP)
        sys.exit(77)
    unittest.main(verbosity=2)
