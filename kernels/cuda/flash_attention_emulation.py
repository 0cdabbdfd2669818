#!/usr/bin/env python3
"""Lane-level emulation of kernels/cuda/flash_attention.cu, for checking its
index arithmetic on a machine without a GPU.

Each kernel is transliterated block by block, warp by warp, lane by lane
(vectorized over the 32 lanes): shared-memory tiles as flat arrays with the
kernel's row stride, ldmatrix / mma.m16n8k16 with the fragment layouts of the
PTX ISA (as summarized in mma.cuh), cp.async zero-fill, quad shuffles, the
masks and the online softmax, bf16 rounding where the kernel packs registers.
The results are compared with a float64 reference of causal attention.

This checks the kernels' bookkeeping (tiles, fragments, masks, ragged edges,
padded head dims), not the hardware: a mistake in the emulated semantics of
an instruction would be shared by kernel and emulation. Run:
    python3 kernels/cuda/flash_attention_emulation.py
"""
import sys

import numpy as np

LANE = np.arange(32)
G = LANE // 4  # groupID
T4 = LANE % 4  # thread in group
MI = LANE >> 3
RI = LANE & 7
BLOCK_ROWS = 64
FWD_KEYS = 64
BWD_QUERIES = 32
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


def bf16(x):
    """Round float32 values to bfloat16 (nearest even), returned as float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32)


def ldmatrix_x4(smem, addrs, trans=False):
    """smem: flat float32; addrs: (32,) element offsets. Returns (4, 32, 2)."""
    regs = np.zeros((4, 32, 2), np.float32)
    cols2 = (2 * T4)[:, None] + np.arange(2)[None, :]
    for i in range(4):
        a = addrs[8 * i:8 * i + 8]
        assert np.all(a % 8 == 0), "ldmatrix row address not 16-byte aligned"
        m = smem[a[:, None] + np.arange(8)[None, :]]  # (8 rows, 8 elements)
        if not trans:
            regs[i] = m[G[:, None], cols2]
        else:
            regs[i] = m[cols2, G[:, None]]
    return regs


def mma(d, a, b0, b1):
    """d (32, 4) += A (16x16 from a (4, 32, 2)) x B (16x8 from b0, b1 (32, 2))."""
    A = np.full((16, 16), np.nan)
    B = np.full((16, 8), np.nan)
    c2 = (2 * T4)[:, None] + np.arange(2)[None, :]
    A[G[:, None], c2] = a[0]
    A[G[:, None] + 8, c2] = a[1]
    A[G[:, None], c2 + 8] = a[2]
    A[G[:, None] + 8, c2 + 8] = a[3]
    B[c2, G[:, None]] = b0
    B[c2 + 8, G[:, None]] = b1
    assert not np.isnan(A).any() and not np.isnan(B).any()
    C = (A.astype(np.float64) @ B.astype(np.float64)).astype(np.float32)
    d[:, 0] += C[G, 2 * T4]
    d[:, 1] += C[G, 2 * T4 + 1]
    d[:, 2] += C[G + 8, 2 * T4]
    d[:, 3] += C[G + 8, 2 * T4 + 1]


def pack(lo, hi):
    return np.stack([bf16(lo), bf16(hi)], axis=1)


def load_tile(s, off, g, row0, seq, D, kD, rows, col_off):
    """LoadTile: rows [row0, row0+rows) of g (seq, *) at columns col_off..; zero-fill."""
    kS = kD + 8
    for r in range(rows):
        for c in range(kD // 8):
            dst = off + r * kS + c * 8
            if row0 + r < seq and c * 8 < D:
                s[dst:dst + 8] = g[row0 + r, col_off + c * 8:col_off + c * 8 + 8]
            else:
                s[dst:dst + 8] = 0.0


def mma_abt(acc, sA, offA, sB, offB, warp, kD, kN):
    kS = kD + 8
    for ks in range(kD // 16):
        a = ldmatrix_x4(sA, offA + (warp * 16 + (LANE & 15)) * kS + ks * 16 + (LANE >> 4) * 8)
        for np_ in range(kN // 16):
            b = ldmatrix_x4(sB, offB + (np_ * 16 + (MI >> 1) * 8 + RI) * kS + ks * 16 + (MI & 1) * 8)
            mma(acc[2 * np_], a, b[0], b[1])
            mma(acc[2 * np_ + 1], a, b[2], b[3])


def mma_pv(acc, p, sV, offV, kD, kK):
    kS = kD + 8
    for kk in range(kK // 16):
        a = np.stack([pack(p[2 * kk][:, 0], p[2 * kk][:, 1]), pack(p[2 * kk][:, 2], p[2 * kk][:, 3]),
                      pack(p[2 * kk + 1][:, 0], p[2 * kk + 1][:, 1]),
                      pack(p[2 * kk + 1][:, 2], p[2 * kk + 1][:, 3])])
        for dp in range(kD // 16):
            b = ldmatrix_x4(sV, offV + (kk * 16 + (MI & 1) * 8 + RI) * kS + dp * 16 + (MI >> 1) * 8,
                            trans=True)
            mma(acc[2 * dp], a, b[0], b[1])
            mma(acc[2 * dp + 1], a, b[2], b[3])


def acc_to_rows(acc, warp, kD, mul):
    """AccToSmem for one warp as a dict row -> (kD,) values (bf16)."""
    out = np.zeros((16, kD), np.float32)
    for nt in range(kD // 8):
        for h in range(2):
            r = G + h * 8
            out[r, nt * 8 + 2 * T4] = bf16(acc[nt][:, 2 * h] * mul)
            out[r, nt * 8 + 2 * T4 + 1] = bf16(acc[nt][:, 2 * h + 1] * mul)
    return out


def quad_reduce(x, op):
    y = x.reshape(8, 4)
    r = op(y, axis=1)
    return np.repeat(r, 4)


def forward(qkv, B, T, H, D, scale):
    """flash_attention_forward_kernel for all blocks. qkv (B, T, 3C) bf16 values."""
    kD = 64 if D <= 64 else 128
    kS = kD + 8
    C = H * D
    out = np.full((B, T, C), np.nan, np.float32)
    lse = np.full((B, H, T), np.nan, np.float32)
    sl2 = np.float32(scale * LOG2E)
    nq = (T + BLOCK_ROWS - 1) // BLOCK_ROWS
    tile = BLOCK_ROWS * kS
    for b in range(B):
        for h in range(H):
            g = qkv[b]
            for qb in range(nq):
                q0 = qb * BLOCK_ROWS
                sQ = np.zeros(tile, np.float32)
                sK = np.zeros(2 * tile, np.float32)
                sV = np.zeros(2 * tile, np.float32)
                load_tile(sQ, 0, g, q0, T, D, kD, BLOCK_ROWS, h * D)
                o = [np.zeros((kD // 8, 32, 4), np.float32) for _ in range(4)]
                m_run = [np.full((32, 2), -np.inf, np.float32) for _ in range(4)]
                l_run = [np.zeros((32, 2), np.float32) for _ in range(4)]
                n_kv = qb + 1
                for j in range(n_kv):
                    st = j & 1
                    load_tile(sK, st * tile, g, j * FWD_KEYS, T, D, kD, FWD_KEYS, C + h * D)
                    load_tile(sV, st * tile, g, j * FWD_KEYS, T, D, kD, FWD_KEYS, 2 * C + h * D)
                    for w in range(4):
                        s = np.zeros((FWD_KEYS // 8, 32, 4), np.float32)
                        mma_abt(s, sQ, 0, sK, st * tile, w, kD, FWD_KEYS)
                        diag = j == qb
                        for nt in range(FWD_KEYS // 8):
                            for e in range(4):
                                v = s[nt][:, e] * sl2
                                if diag:
                                    key = nt * 8 + 2 * T4 + (e & 1)
                                    query = w * 16 + G + (e >> 1) * 8
                                    v = np.where(key > query, -np.inf, v)
                                s[nt][:, e] = v
                        for r in range(2):
                            mx = np.max(np.maximum(s[:, :, 2 * r], s[:, :, 2 * r + 1]), axis=0)
                            mx = quad_reduce(mx, np.max)
                            m_new = np.maximum(m_run[w][:, r], mx)
                            alpha = np.exp2(m_run[w][:, r] - m_new)
                            m_run[w][:, r] = m_new
                            l_run[w][:, r] *= alpha
                            o[w][:, :, 2 * r] *= alpha
                            o[w][:, :, 2 * r + 1] *= alpha
                            for nt in range(FWD_KEYS // 8):
                                p0 = np.exp2(s[nt][:, 2 * r] - m_new)
                                p1 = np.exp2(s[nt][:, 2 * r + 1] - m_new)
                                s[nt][:, 2 * r] = p0
                                s[nt][:, 2 * r + 1] = p1
                                l_run[w][:, r] += p0 + p1
                        mma_pv(o[w], s, sV, st * tile, kD, FWD_KEYS)
                for w in range(4):
                    inv = np.zeros((32, 2), np.float32)
                    for r in range(2):
                        l = quad_reduce(l_run[w][:, r], np.sum)
                        inv[:, r] = 1.0 / l
                        q = q0 + w * 16 + G + r * 8
                        sel = (T4 == 0) & (q < T)
                        lse[b, h, q[sel]] = (m_run[w][sel, r] + np.log2(l[sel])) * LN2
                    ow = o[w].copy()
                    ow[:, :, 0] *= inv[:, 0]
                    ow[:, :, 1] *= inv[:, 0]
                    ow[:, :, 2] *= inv[:, 1]
                    ow[:, :, 3] *= inv[:, 1]
                    rows = acc_to_rows(ow, w, kD, 1.0)
                    for rr in range(16):
                        q = q0 + w * 16 + rr
                        if q < T:
                            out[b, q, h * D:h * D + D] = rows[rr, :D]
    return out, lse


def backward(qkv, dout, out, lse, B, T, H, D, scale):
    kD = 64 if D <= 64 else 128
    kS = kD + 8
    C = H * D
    sl2 = np.float32(scale * LOG2E)
    dqkv = np.full((B, T, 3 * C), np.nan, np.float32)
    delta = np.zeros((B, H, T), np.float32)
    for b in range(B):
        for t in range(T):
            for h in range(H):
                delta[b, h, t] = np.float32(np.sum(out[b, t, h * D:h * D + D].astype(np.float64) *
                                                   dout[b, t, h * D:h * D + D]))
    nblk = (T + BLOCK_ROWS - 1) // BLOCK_ROWS
    n_qt = (T + BWD_QUERIES - 1) // BWD_QUERIES
    qt_tile = BWD_QUERIES * kS
    tile = BLOCK_ROWS * kS
    for b in range(B):
        for h in range(H):
            g = qkv[b]
            gd = dout[b]
            # dK, dV kernel
            for kb in range(nblk):
                k0 = kb * BLOCK_ROWS
                sK = np.zeros(tile, np.float32)
                sV = np.zeros(tile, np.float32)
                load_tile(sK, 0, g, k0, T, D, kD, BLOCK_ROWS, C + h * D)
                load_tile(sV, 0, g, k0, T, D, kD, BLOCK_ROWS, 2 * C + h * D)
                dk = [np.zeros((kD // 8, 32, 4), np.float32) for _ in range(4)]
                dv = [np.zeros((kD // 8, 32, 4), np.float32) for _ in range(4)]
                qt_begin = k0 // BWD_QUERIES
                for it in range(qt_begin, n_qt):
                    r0 = it * BWD_QUERIES
                    sQ = np.zeros(qt_tile, np.float32)
                    sdO = np.zeros(qt_tile, np.float32)
                    load_tile(sQ, 0, g, r0, T, D, kD, BWD_QUERIES, h * D)
                    load_tile(sdO, 0, gd, r0, T, D, kD, BWD_QUERIES, h * D)
                    sL = np.array([lse[b, h, r0 + i] * LOG2E if r0 + i < T else np.inf
                                   for i in range(BWD_QUERIES)], np.float32)
                    sD = np.array([delta[b, h, r0 + i] if r0 + i < T else 0.0
                                   for i in range(BWD_QUERIES)], np.float32)
                    for w in range(4):
                        my_key0 = k0 + w * 16 + G
                        pt = np.zeros((BWD_QUERIES // 8, 32, 4), np.float32)
                        mma_abt(pt, sK, 0, sQ, 0, w, kD, BWD_QUERIES)
                        for nt in range(BWD_QUERIES // 8):
                            for e in range(4):
                                ql = nt * 8 + 2 * T4 + (e & 1)
                                key = my_key0 + (e >> 1) * 8
                                p = np.exp2(pt[nt][:, e] * sl2 - sL[ql])
                                p = np.where(r0 + ql < key, 0.0, p)
                                pt[nt][:, e] = p
                        dpt = np.zeros((BWD_QUERIES // 8, 32, 4), np.float32)
                        mma_abt(dpt, sV, 0, sdO, 0, w, kD, BWD_QUERIES)
                        mma_pv(dv[w], pt, sdO, 0, kD, BWD_QUERIES)
                        for nt in range(BWD_QUERIES // 8):
                            for e in range(4):
                                ql = nt * 8 + 2 * T4 + (e & 1)
                                dpt[nt][:, e] = pt[nt][:, e] * (dpt[nt][:, e] - sD[ql])
                        mma_pv(dk[w], dpt, sQ, 0, kD, BWD_QUERIES)
                for w in range(4):
                    rk = acc_to_rows(dk[w], w, kD, scale)
                    rv = acc_to_rows(dv[w], w, kD, 1.0)
                    for rr in range(16):
                        k = k0 + w * 16 + rr
                        if k < T:
                            dqkv[b, k, C + h * D:C + h * D + D] = rk[rr, :D]
                            dqkv[b, k, 2 * C + h * D:2 * C + h * D + D] = rv[rr, :D]
            # dQ kernel
            for qb in range(nblk):
                q0 = qb * BLOCK_ROWS
                sQ = np.zeros(tile, np.float32)
                sdO = np.zeros(tile, np.float32)
                load_tile(sQ, 0, g, q0, T, D, kD, BLOCK_ROWS, h * D)
                load_tile(sdO, 0, gd, q0, T, D, kD, BLOCK_ROWS, h * D)
                dq = [np.zeros((kD // 8, 32, 4), np.float32) for _ in range(4)]
                for j in range(qb + 1):
                    sK = np.zeros(tile, np.float32)
                    sV = np.zeros(tile, np.float32)
                    load_tile(sK, 0, g, j * FWD_KEYS, T, D, kD, FWD_KEYS, C + h * D)
                    load_tile(sV, 0, g, j * FWD_KEYS, T, D, kD, FWD_KEYS, 2 * C + h * D)
                    for w in range(4):
                        lse2 = np.zeros((32, 2), np.float32)
                        dlt = np.zeros((32, 2), np.float32)
                        for r in range(2):
                            q = q0 + w * 16 + G + r * 8
                            ok = q < T
                            qc = np.minimum(q, T - 1)
                            lse2[:, r] = np.where(ok, lse[b, h, qc] * LOG2E, np.inf)
                            dlt[:, r] = np.where(ok, delta[b, h, qc], 0.0)
                        p = np.zeros((FWD_KEYS // 8, 32, 4), np.float32)
                        mma_abt(p, sQ, 0, sK, 0, w, kD, FWD_KEYS)
                        diag = j == qb
                        for nt in range(FWD_KEYS // 8):
                            for e in range(4):
                                v = np.exp2(p[nt][:, e] * sl2 - lse2[:, e >> 1])
                                if diag:
                                    key = nt * 8 + 2 * T4 + (e & 1)
                                    query = w * 16 + G + (e >> 1) * 8
                                    v = np.where(key > query, 0.0, v)
                                p[nt][:, e] = v
                        dp = np.zeros((FWD_KEYS // 8, 32, 4), np.float32)
                        mma_abt(dp, sdO, 0, sV, 0, w, kD, FWD_KEYS)
                        for nt in range(FWD_KEYS // 8):
                            for e in range(4):
                                dp[nt][:, e] = p[nt][:, e] * (dp[nt][:, e] - dlt[:, e >> 1])
                        mma_pv(dq[w], dp, sK, 0, kD, FWD_KEYS)
                for w in range(4):
                    rq = acc_to_rows(dq[w], w, kD, scale)
                    for rr in range(16):
                        q = q0 + w * 16 + rr
                        if q < T:
                            dqkv[b, q, h * D:h * D + D] = rq[rr, :D]
    return dqkv


def reference(qkv, dout, B, T, H, D, scale):
    """float64 causal attention forward and backward."""
    C = H * D
    x = qkv.astype(np.float64)
    do = dout.astype(np.float64)
    out = np.zeros((B, T, C))
    lse = np.zeros((B, H, T))
    dqkv = np.zeros((B, T, 3 * C))
    mask = np.tril(np.ones((T, T), bool))
    for b in range(B):
        for h in range(H):
            q = x[b, :, h * D:h * D + D]
            k = x[b, :, C + h * D:C + h * D + D]
            v = x[b, :, 2 * C + h * D:2 * C + h * D + D]
            s = np.where(mask, q @ k.T * scale, -np.inf)
            m = s.max(axis=1, keepdims=True)
            e = np.exp(s - m)
            l = e.sum(axis=1, keepdims=True)
            p = e / l
            o = p @ v
            out[b, :, h * D:h * D + D] = o
            lse[b, h] = (m + np.log(l))[:, 0]
            dO = do[b, :, h * D:h * D + D]
            dv = p.T @ dO
            dp = dO @ v.T
            dlt = (dO * o).sum(axis=1, keepdims=True)
            ds = p * (dp - dlt)
            dqkv[b, :, h * D:h * D + D] = ds @ k * scale
            dqkv[b, :, C + h * D:C + h * D + D] = ds.T @ q * scale
            dqkv[b, :, 2 * C + h * D:2 * C + h * D + D] = dv
    return out, lse, dqkv


def relerr(a, r):
    a = np.asarray(a, np.float64)
    if not np.isfinite(a).all():
        return np.inf
    den = np.linalg.norm(r)
    return np.linalg.norm(a - r) / den if den > 0 else np.linalg.norm(a - r)


def main():
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    cases = [(1, 1, 2, 32), (1, 127, 3, 32), (2, 70, 1, 64), (1, 130, 2, 64), (1, 100, 2, 128),
             (1, 65, 1, 16), (1, 90, 2, 40), (1, 64, 1, 96)]
    ok = True
    print(f"{'B':>2} {'T':>4} {'H':>2} {'D':>4}  {'out':>9} {'lse':>9} {'dq':>9} {'dk':>9} {'dv':>9}")
    for (B, T, H, D) in cases:
        C = H * D
        scale = 1.0 / np.sqrt(D)
        qkv = bf16(rng.uniform(-2, 2, (B, T, 3 * C)).astype(np.float32))
        dout = bf16(rng.uniform(-1, 1, (B, T, C)).astype(np.float32))
        out, lse = forward(qkv, B, T, H, D, scale)
        r_out, r_lse, r_dqkv = reference(qkv, dout, B, T, H, D, scale)
        # The backward gets the forward results as the kernels would (bf16 out).
        dqkv = backward(qkv, dout, bf16(out), lse, B, T, H, D, scale)
        e = [relerr(out, r_out), relerr(lse, r_lse)]
        for part in range(3):
            e.append(relerr(dqkv[:, :, part * C:(part + 1) * C], r_dqkv[:, :, part * C:(part + 1) * C]))
        bad = any(not (x < 1e-2) for x in e) or e[1] > 1e-5
        ok &= not bad
        print(f"{B:>2} {T:>4} {H:>2} {D:>4}  " + " ".join(f"{x:9.2e}" for x in e) +
              ("  FAIL" if bad else ""))
    print("all within tolerance" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
