# SPDX-License-Identifier: Apache-2.0
"""strata.CpuAdam through libstrata.so against a pure-Python reference.

The reference evaluates strata's per-element sequence (kernels/adam_gpu.h,
AdamCoefficients: DeepSpeed's fma order) in IEEE fp32 exactly: every product,
quotient and square root of fp32 values is computed in double and rounded to
fp32 once, which is the correctly rounded fp32 result (double has more than
2*24+2 bits, so the double rounding is innocuous for + - * / sqrt); each fma
is computed exactly with fractions and rounded to fp32 once. The per-step
constants are computed in double and rounded once, as MakeAdamCoefficients
does. So the comparison is bitwise, not within a tolerance: any difference
is a real difference in the operations the library performs.
"""

import array
import math
import struct
import unittest
from fractions import Fraction

import strata

try:
    import numpy
except ImportError:
    numpy = None


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def f16(x):
    return struct.unpack("e", struct.pack("e", x))[0]


def f16_bits(xs):
    """fp16 values as an array of their bits (array.array has no fp16 type)."""
    return array.array("H", struct.unpack("%dH" % len(xs), struct.pack("%de" % len(xs), *xs)))


def f16_values(bits):
    return list(struct.unpack("%de" % len(bits), bits.tobytes()))


def round_f32_exact(q):
    """The fp32 nearest (ties to even) to the rational q."""
    if q == 0:
        return 0.0
    sign = -1.0 if q < 0 else 1.0
    q = abs(q)
    e = q.numerator.bit_length() - q.denominator.bit_length()
    while q >= Fraction(2) ** (e + 1):
        e += 1
    while q < Fraction(2) ** e:
        e -= 1
    e = max(e, -126)  # subnormals share the smallest exponent's quantum
    ulp = Fraction(2) ** (e - 23)
    k = q / ulp
    n = k.numerator // k.denominator
    rest = k - n
    if rest > Fraction(1, 2) or (rest == Fraction(1, 2) and n % 2 == 1):
        n += 1
    return sign * float(n * ulp)


def fma(a, b, c):
    return round_f32_exact(Fraction(a) * Fraction(b) + Fraction(c))


def reference_step(p, m, v, g, *, step, lr, b1, b2, eps, wd, decoupled, bias_correction, grad_scale):
    """One step in place on lists of fp32 values; returns the f16 copy."""
    bc1 = 1.0 - b1 ** step if bias_correction else 1.0
    bc2 = 1.0 - b2 ** step if bias_correction else 1.0
    c_b1, c_omb1, c_b2, c_omb2 = f32(b1), f32(1.0 - b1), f32(b2), f32(1.0 - b2)
    c_eps, c_neg_step, c_inv_sqrt_bc2 = f32(eps), f32(-lr / bc1), f32(1.0 / math.sqrt(bc2))
    c_neg_lr_decay = f32(-lr * wd) if decoupled else 0.0
    c_l2 = 0.0 if decoupled else f32(wd)
    c_gs = f32(grad_scale)
    out = []
    for i in range(len(p)):
        gi = f32(g[i] * c_gs)
        if c_l2 != 0.0:
            gi = fma(p[i], c_l2, gi)
        m[i] = fma(gi, c_omb1, f32(m[i] * c_b1))
        v[i] = fma(f32(gi * gi), c_omb2, f32(v[i] * c_b2))
        d = fma(f32(math.sqrt(v[i])), c_inv_sqrt_bc2, c_eps)
        u = f32(m[i] / d)
        if c_neg_lr_decay != 0.0:
            p[i] = fma(p[i], c_neg_lr_decay, p[i])
        p[i] = fma(u, c_neg_step, p[i])
        out.append(f16(p[i]))
    return out


def values(n, seed, lo, hi):
    """Deterministic fp32 values in [lo, hi) (a small LCG: no random module state)."""
    x = seed * 2654435761 % (1 << 32)
    out = []
    for _ in range(n):
        x = (x * 1664525 + 1013904223) % (1 << 32)
        out.append(f32(lo + (hi - lo) * x / (1 << 32)))
    return out


class AdamTest(unittest.TestCase):
    N = 131  # several SIMD widths and a ragged end

    @classmethod
    def setUpClass(cls):
        cls.adam = strata.CpuAdam(threads=2)

    def run_case(self, *, decoupled, bias_correction, grad_f16):
        n = self.N
        p = values(n, 1, -1.0, 1.0)
        m = values(n, 2, -0.1, 0.1)
        v = values(n, 3, 0.0, 0.01)
        g = [f16(x) if grad_f16 else x for x in values(n, 4, -2.0, 2.0)]
        master, ma, va = array.array("f", p), array.array("f", m), array.array("f", v)
        grad = f16_bits(g) if grad_f16 else array.array("f", g)
        out = array.array("H", [0] * n)
        hyper = dict(lr=1e-2, b1=0.9, b2=0.999, eps=1e-8, wd=0.1)
        for step in (1, 2, 3):
            ref_out = reference_step(p, m, v, g, step=step, decoupled=decoupled, bias_correction=bias_correction,
                                     grad_scale=0.5, **hyper)
            r = self.adam.step(master, ma, va, grad, step=step, lr=hyper["lr"], betas=(hyper["b1"], hyper["b2"]),
                               eps=hyper["eps"], weight_decay=hyper["wd"], grad_scale=0.5,
                               decay="decoupled" if decoupled else "l2", bias_correction=bias_correction,
                               param_out=out, param_out_dtype="f16", grad_dtype="f16" if grad_f16 else None)
            self.assertEqual(r, strata.StepResult(0, False))
            self.assertEqual(list(master), p, "master differs at step %d" % step)
            self.assertEqual(list(ma), m)
            self.assertEqual(list(va), v)
            self.assertEqual(f16_values(out), ref_out)

    def test_adamw_bitwise_the_reference(self):
        self.run_case(decoupled=True, bias_correction=True, grad_f16=False)

    def test_adam_l2_f16_grad_bitwise_the_reference(self):
        self.run_case(decoupled=False, bias_correction=True, grad_f16=True)

    def test_no_bias_correction_bitwise_the_reference(self):
        self.run_case(decoupled=True, bias_correction=False, grad_f16=True)

    @unittest.skipIf(numpy is None, "numpy is not installed (optional)")
    def test_numpy_buffers_give_the_same_bits(self):
        n = 1000
        base = numpy.linspace(-1, 1, n, dtype=numpy.float32)
        a = [base.copy(), numpy.zeros(n, numpy.float32), numpy.full(n, 1e-3, numpy.float32)]
        b = [array.array("f", x.tobytes()) for x in a]
        grad = (base[::-1] * 3).astype(numpy.float16)
        out_np = numpy.zeros(n, numpy.float32)
        out_arr = array.array("f", [0.0] * n)
        for step in (1, 2):
            self.adam.step(*a, grad, step=step, weight_decay=0.01, param_out=out_np)
            self.adam.step(*b, array.array("H", grad.tobytes()), step=step, weight_decay=0.01, param_out=out_arr,
                           grad_dtype="f16")
        self.assertEqual(a[0].tobytes(), b[0].tobytes())
        self.assertEqual(out_np.tobytes(), out_arr.tobytes())
        self.assertEqual(a[0].tobytes(), out_np.tobytes())  # f32 copy-out is the master

    def test_skip_on_nonfinite_writes_nothing(self):
        n = 64
        master = array.array("f", [1.0] * n)
        m, v = array.array("f", [0.0] * n), array.array("f", [0.0] * n)
        grad = array.array("f", [0.5] * n)
        grad[10] = float("nan")
        grad[20] = float("-inf")
        r = self.adam.step(master, m, v, grad, step=1, skip_on_nonfinite=True)
        self.assertEqual(r, strata.StepResult(2, True))
        self.assertEqual(list(master), [1.0] * n)
        r = self.adam.step(master, m, v, grad, step=1)
        self.assertEqual(r, strata.StepResult(2, False))
        self.assertTrue(math.isnan(master[10]))

    def test_bf16_needs_its_dtype_spelled_out(self):
        n = 64
        master = array.array("f", [1.0] * n)
        m, v = array.array("H", [0] * n), array.array("H", [0] * n)  # bf16 state as uint16
        grad = array.array("f", [0.5] * n)
        with self.assertRaises(strata.InvalidArgumentError) as cm:
            self.adam.step(master, m, v, grad, step=1)
        self.assertIn("pass state_dtype", cm.exception.message)
        self.adam.step(master, m, v, grad, step=1, state_dtype="bf16")
        self.assertLess(master[0], 1.0)
        self.assertNotEqual(m[0], 0)

    def test_errors(self):
        n = 16
        bufs = lambda: [array.array("f", [1.0] * n), array.array("f", [0.0] * n), array.array("f", [0.0] * n),
                        array.array("f", [0.5] * n)]
        cases = [
            (dict(lr=-1.0), "AdamHyper.lr must be finite and >= 0"),
            (dict(betas=(1.0, 0.999)), "AdamHyper.beta1"),
            (dict(eps=-1.0), "AdamHyper.eps"),
            (dict(weight_decay=float("nan")), "AdamHyper.weight_decay"),
            (dict(grad_scale=-2.0), "grad_scale"),
        ]
        for kw, text in cases:
            b = bufs()
            with self.assertRaises(strata.InvalidArgumentError) as cm:
                self.adam.step(*b, step=1, **kw)
            self.assertIn(text, cm.exception.message)
            self.assertEqual(cm.exception.code, strata.errors.INVALID_ARGUMENT)
            self.assertEqual(list(b[0]), [1.0] * n)  # nothing written
        with self.assertRaises(strata.InvalidArgumentError) as cm:
            self.adam.step(*bufs(), step=0)
        self.assertIn("AdamHyper.step counts from 1", cm.exception.message)
        b = bufs()
        with self.assertRaises(strata.InvalidArgumentError) as cm:
            self.adam.step(b[0], b[1], array.array("f", [0.0] * (n - 1)), b[3], step=1)
        self.assertIn("exp_avg_sq holds 60 bytes", cm.exception.message)
        with self.assertRaises(strata.InvalidArgumentError):
            self.adam.step(*bufs(), step=1, decay="sgd")
        with self.assertRaises(strata.InvalidArgumentError) as cm:
            strata.CpuAdam(tile_elems=100)
        self.assertIn("tile_elems", cm.exception.message)

    def test_grad_stats_and_clipping(self):
        g = array.array("f", [0.5, -2.0, 3.0] * 100)
        st = self.adam.grad_stats(g)
        self.assertEqual(st.count, 300)
        self.assertEqual(st.nonfinite, 0)
        self.assertAlmostEqual(st.sum_sq, 100 * (0.25 + 4.0 + 9.0), places=9)
        total = st.merge(st)
        self.assertEqual(total.count, 600)
        norm = strata.global_grad_norm(total, loss_scale=2.0)
        self.assertAlmostEqual(norm, math.sqrt(2 * st.sum_sq) / 2.0, places=12)
        coef = strata.clip_coefficient(norm, 1.0)
        self.assertAlmostEqual(coef, 1.0 / (norm + 1e-6), places=15)
        self.assertEqual(strata.clip_coefficient(norm, 0.0), 1.0)
        self.assertEqual(strata.grad_multiplier(4.0, 0.5), 0.125)
        bad = array.array("f", [1.0, float("inf")])
        st = self.adam.grad_stats(bad)
        self.assertTrue(st.overflow)
        self.assertEqual(strata.global_grad_norm(st), float("inf"))
        with self.assertRaises(strata.InvalidArgumentError) as cm:
            strata.global_grad_norm(st, loss_scale=0.0)
        self.assertIn("loss_scale must be finite and > 0", cm.exception.message)
        with self.assertRaises(strata.InvalidArgumentError):
            strata.clip_coefficient(1.0, float("nan"))
        with self.assertRaises(strata.InvalidArgumentError):
            self.adam.grad_stats(array.array("b", [1, 2]), dtype="i8")


if __name__ == "__main__":
    unittest.main()
