#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Lane-level emulation of the mma.sync flash attention kernels
(kernels/cuda/flash_attention.cu, flash_attention_bwd_two_pass.cu,
flash_attention_bwd_ds.cu), for checking their index arithmetic on a machine
without a GPU.

Each kernel is transliterated block by block, warp by warp, lane by lane
(vectorized over the 32 lanes): shared-memory tiles as flat arrays with the
kernel's row stride, ldmatrix / mma.m16n8k16 with the fragment layouts of the
PTX ISA (as summarized in mma.cuh), cp.async zero-fill, quad shuffles, the
masks and the online softmax, bf16 rounding where the kernel packs registers.
The results are compared with a float64 reference of causal attention.

This checks the kernels' bookkeeping (tiles, fragments, masks, ragged edges,
padded head dims), not the hardware: a mistake in the emulated semantics of
an instruction would be shared by kernel and emulation. Every kernel variant
(cuda_backend.h, kFlashVariants) is emulated. Run:
    python3 kernels/cuda/flash_attention_emulation.py [seed [variant,...]]
"""
import sys

import numpy as np

LANE = np.arange(32)
G = LANE // 4  # groupID
T4 = LANE % 4  # thread in group
MI = LANE >> 3
RI = LANE & 7
KM = 2                # m-tiles per warp in the forward and dQ kernels
BR = 4 * 16 * KM      # rows per forward / dQ block
DKDV_KEYS = 64
BWD_QUERIES = 32


def fwd_bc(kD):
    return 64 if kD <= 64 else 32


DQ_BC = 32
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


def mma_abt(acc, sA, offA, row0, sB, offB, kD, kM, kN):
    """acc[kM][kN/8] (32, 4) += A (rows row0.. of sA) x B^T (sB rows = n)."""
    kS = kD + 8
    for ks in range(kD // 16):
        a = [ldmatrix_x4(sA, offA + (row0 + mt * 16 + (LANE & 15)) * kS + ks * 16 + (LANE >> 4) * 8)
             for mt in range(kM)]
        for np_ in range(kN // 16):
            b = ldmatrix_x4(sB, offB + (np_ * 16 + (MI >> 1) * 8 + RI) * kS + ks * 16 + (MI & 1) * 8)
            for mt in range(kM):
                mma(acc[mt][2 * np_], a[mt], b[0], b[1])
                mma(acc[mt][2 * np_ + 1], a[mt], b[2], b[3])


def mma_pv(acc, p, sV, offV, kD, kM, kK):
    kS = kD + 8
    for kk in range(kK // 16):
        a = [np.stack([pack(p[mt][2 * kk][:, 0], p[mt][2 * kk][:, 1]),
                       pack(p[mt][2 * kk][:, 2], p[mt][2 * kk][:, 3]),
                       pack(p[mt][2 * kk + 1][:, 0], p[mt][2 * kk + 1][:, 1]),
                       pack(p[mt][2 * kk + 1][:, 2], p[mt][2 * kk + 1][:, 3])]) for mt in range(kM)]
        for dp in range(kD // 16):
            b = ldmatrix_x4(sV, offV + (kk * 16 + (MI & 1) * 8 + RI) * kS + dp * 16 + (MI >> 1) * 8,
                            trans=True)
            for mt in range(kM):
                mma(acc[mt][2 * dp], a[mt], b[0], b[1])
                mma(acc[mt][2 * dp + 1], a[mt], b[2], b[3])


def acc_to_rows(acc, kD, mul):
    """AccToSmem for one warp's kM m-tiles: (16 kM, kD) values (bf16)."""
    kM = len(acc)
    out = np.zeros((16 * kM, kD), np.float32)
    for mt in range(kM):
        for nt in range(kD // 8):
            for h in range(2):
                r = mt * 16 + G + h * 8
                out[r, nt * 8 + 2 * T4] = bf16(acc[mt][nt][:, 2 * h] * mul)
                out[r, nt * 8 + 2 * T4 + 1] = bf16(acc[mt][nt][:, 2 * h + 1] * mul)
    return out


def quad_reduce(x, op):
    y = x.reshape(8, 4)
    r = op(y, axis=1)
    return np.repeat(r, 4)


def zeros(kM, n):
    return [np.zeros((n, 32, 4), np.float32) for _ in range(kM)]


def forward(qkv, B, T, H, D, scale, kBc=None, fma=False):
    """flash_attention_forward_kernel<T, kD, kBc, fma> for all blocks. qkv (B, T, 3C) bf16 values."""
    kD = 64 if D <= 64 else 128
    kS = kD + 8
    kBc = kBc or fwd_bc(kD)
    C = H * D
    out = np.full((B, T, C), np.nan, np.float32)
    lse = np.full((B, H, T), np.nan, np.float32)
    sl2 = np.float32(scale * LOG2E)
    nq = (T + BR - 1) // BR
    kv = kBc * kS
    for b in range(B):
        for h in range(H):
            g = qkv[b]
            for qb in range(nq):
                q0 = qb * BR
                sQ = np.zeros(BR * kS, np.float32)
                sK = np.zeros(2 * kv, np.float32)
                sV = np.zeros(2 * kv, np.float32)
                load_tile(sQ, 0, g, q0, T, D, kD, BR, h * D)
                o = [zeros(KM, kD // 8) for _ in range(4)]
                m_run = [np.full((KM, 32, 2), -np.inf, np.float32) for _ in range(4)]
                l_run = [np.zeros((KM, 32, 2), np.float32) for _ in range(4)]
                n_kv = (min(T, q0 + BR) + kBc - 1) // kBc
                for j in range(n_kv):
                    st = j & 1
                    load_tile(sK, st * kv, g, j * kBc, T, D, kD, kBc, C + h * D)
                    load_tile(sV, st * kv, g, j * kBc, T, D, kD, kBc, 2 * C + h * D)
                    k0 = j * kBc
                    for w in range(4):
                        row0 = w * 16 * KM
                        if not (k0 <= q0 + row0 + 16 * KM - 1):
                            continue
                        s = zeros(KM, kBc // 8)
                        mma_abt(s, sQ, 0, row0, sK, st * kv, kD, KM, kBc)
                        mask = k0 + kBc - 1 > q0 + row0
                        for mt in range(KM):
                            for nt in range(kBc // 8):
                                for e in range(4):
                                    v = s[mt][nt][:, e] if fma else s[mt][nt][:, e] * sl2
                                    if mask:
                                        key = k0 + nt * 8 + 2 * T4 + (e & 1)
                                        query = q0 + row0 + mt * 16 + G + (e >> 1) * 8
                                        v = np.where(key > query, -np.inf, v)
                                    s[mt][nt][:, e] = v
                            for r in range(2):
                                mx = np.max(np.maximum(s[mt][:, :, 2 * r], s[mt][:, :, 2 * r + 1]), axis=0)
                                mx = quad_reduce(mx, np.max)
                                m_new = np.maximum(m_run[w][mt, :, r], mx)
                                if fma:
                                    alpha = np.exp2((m_run[w][mt, :, r] - m_new) * sl2)
                                    m_sub = m_new * sl2
                                else:
                                    alpha = np.exp2(m_run[w][mt, :, r] - m_new)
                                    m_sub = m_new
                                m_run[w][mt, :, r] = m_new
                                l_run[w][mt, :, r] *= alpha
                                o[w][mt][:, :, 2 * r] *= alpha
                                o[w][mt][:, :, 2 * r + 1] *= alpha
                                for nt in range(kBc // 8):
                                    if fma:
                                        p0 = np.exp2(np.float32(s[mt][nt][:, 2 * r] * sl2 - m_sub))
                                        p1 = np.exp2(np.float32(s[mt][nt][:, 2 * r + 1] * sl2 - m_sub))
                                    else:
                                        p0 = np.exp2(s[mt][nt][:, 2 * r] - m_sub)
                                        p1 = np.exp2(s[mt][nt][:, 2 * r + 1] - m_sub)
                                    s[mt][nt][:, 2 * r] = p0
                                    s[mt][nt][:, 2 * r + 1] = p1
                                    l_run[w][mt, :, r] += p0 + p1
                        mma_pv(o[w], s, sV, st * kv, kD, KM, kBc)
                for w in range(4):
                    row0 = w * 16 * KM
                    for mt in range(KM):
                        for r in range(2):
                            l = quad_reduce(l_run[w][mt, :, r], np.sum)
                            inv = 1.0 / l
                            q = q0 + row0 + mt * 16 + G + r * 8
                            sel = (T4 == 0) & (q < T)
                            m_l2 = m_run[w][mt, sel, r] * sl2 if fma else m_run[w][mt, sel, r]
                            lse[b, h, q[sel]] = (m_l2 + np.log2(l[sel])) * LN2
                            o[w][mt][:, :, 2 * r] *= inv
                            o[w][mt][:, :, 2 * r + 1] *= inv
                    rows = acc_to_rows(o[w], kD, 1.0)
                    for rr in range(16 * KM):
                        q = q0 + row0 + rr
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
    n_kb = (T + DKDV_KEYS - 1) // DKDV_KEYS
    n_qt = (T + BWD_QUERIES - 1) // BWD_QUERIES
    n_qb = (T + BR - 1) // BR
    qt_tile = BWD_QUERIES * kS
    for b in range(B):
        for h in range(H):
            g = qkv[b]
            gd = dout[b]
            # dK, dV kernel
            for kb in range(n_kb):
                k0 = kb * DKDV_KEYS
                sK = np.zeros(DKDV_KEYS * kS, np.float32)
                sV = np.zeros(DKDV_KEYS * kS, np.float32)
                load_tile(sK, 0, g, k0, T, D, kD, DKDV_KEYS, C + h * D)
                load_tile(sV, 0, g, k0, T, D, kD, DKDV_KEYS, 2 * C + h * D)
                dk = [zeros(1, kD // 8) for _ in range(4)]
                dv = [zeros(1, kD // 8) for _ in range(4)]
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
                        row0 = w * 16
                        if not (r0 + BWD_QUERIES - 1 >= k0 + row0):
                            continue
                        my_key0 = k0 + row0 + G
                        pt = zeros(1, BWD_QUERIES // 8)
                        mma_abt(pt, sK, 0, row0, sQ, 0, kD, 1, BWD_QUERIES)
                        for nt in range(BWD_QUERIES // 8):
                            for e in range(4):
                                ql = nt * 8 + 2 * T4 + (e & 1)
                                key = my_key0 + (e >> 1) * 8
                                p = np.exp2(pt[0][nt][:, e] * sl2 - sL[ql])
                                p = np.where(r0 + ql < key, 0.0, p)
                                pt[0][nt][:, e] = p
                        dpt = zeros(1, BWD_QUERIES // 8)
                        mma_abt(dpt, sV, 0, row0, sdO, 0, kD, 1, BWD_QUERIES)
                        mma_pv(dv[w], pt, sdO, 0, kD, 1, BWD_QUERIES)
                        for nt in range(BWD_QUERIES // 8):
                            for e in range(4):
                                ql = nt * 8 + 2 * T4 + (e & 1)
                                dpt[0][nt][:, e] = pt[0][nt][:, e] * (dpt[0][nt][:, e] - sD[ql])
                        mma_pv(dk[w], dpt, sQ, 0, kD, 1, BWD_QUERIES)
                for w in range(4):
                    rk = acc_to_rows(dk[w], kD, scale)
                    rv = acc_to_rows(dv[w], kD, 1.0)
                    for rr in range(16):
                        k = k0 + w * 16 + rr
                        if k < T:
                            dqkv[b, k, C + h * D:C + h * D + D] = rk[rr, :D]
                            dqkv[b, k, 2 * C + h * D:2 * C + h * D + D] = rv[rr, :D]
            # dQ kernel
            kv = DQ_BC * kS
            for qb in range(n_qb):
                q0 = qb * BR
                sQ = np.zeros(BR * kS, np.float32)
                sdO = np.zeros(BR * kS, np.float32)
                load_tile(sQ, 0, g, q0, T, D, kD, BR, h * D)
                load_tile(sdO, 0, gd, q0, T, D, kD, BR, h * D)
                dq = [zeros(KM, kD // 8) for _ in range(4)]
                n_kv = (min(T, q0 + BR) + DQ_BC - 1) // DQ_BC
                for j in range(n_kv):
                    sK = np.zeros(kv, np.float32)
                    sV = np.zeros(kv, np.float32)
                    load_tile(sK, 0, g, j * DQ_BC, T, D, kD, DQ_BC, C + h * D)
                    load_tile(sV, 0, g, j * DQ_BC, T, D, kD, DQ_BC, 2 * C + h * D)
                    k0 = j * DQ_BC
                    for w in range(4):
                        row0 = w * 16 * KM
                        if not (k0 <= q0 + row0 + 16 * KM - 1):
                            continue
                        lse2 = np.zeros((KM, 32, 2), np.float32)
                        dlt = np.zeros((KM, 32, 2), np.float32)
                        for mt in range(KM):
                            for r in range(2):
                                q = q0 + row0 + mt * 16 + G + r * 8
                                ok = q < T
                                qc = np.minimum(q, T - 1)
                                lse2[mt, :, r] = np.where(ok, lse[b, h, qc] * LOG2E, np.inf)
                                dlt[mt, :, r] = np.where(ok, delta[b, h, qc], 0.0)
                        p = zeros(KM, DQ_BC // 8)
                        mma_abt(p, sQ, 0, row0, sK, 0, kD, KM, DQ_BC)
                        mask = k0 + DQ_BC - 1 > q0 + row0
                        for mt in range(KM):
                            for nt in range(DQ_BC // 8):
                                for e in range(4):
                                    v = np.exp2(p[mt][nt][:, e] * sl2 - lse2[mt, :, e >> 1])
                                    if mask:
                                        key = k0 + nt * 8 + 2 * T4 + (e & 1)
                                        query = q0 + row0 + mt * 16 + G + (e >> 1) * 8
                                        v = np.where(key > query, 0.0, v)
                                    p[mt][nt][:, e] = v
                        dp = zeros(KM, DQ_BC // 8)
                        mma_abt(dp, sdO, 0, row0, sV, 0, kD, KM, DQ_BC)
                        for mt in range(KM):
                            for nt in range(DQ_BC // 8):
                                for e in range(4):
                                    dp[mt][nt][:, e] = p[mt][nt][:, e] * (dp[mt][nt][:, e] - dlt[mt, :, e >> 1])
                        mma_pv(dq[w], dp, sK, 0, kD, KM, DQ_BC)
                for w in range(4):
                    row0 = w * 16 * KM
                    rq = acc_to_rows(dq[w], kD, scale)
                    for rr in range(16 * KM):
                        q = q0 + row0 + rr
                        if q < T:
                            dqkv[b, q, h * D:h * D + D] = rq[rr, :D]
    return dqkv


# ---- the dS-buffer backward (variant bwd kDsBuffer) -----------------------------

DS_KEYS = 128
DS_QUERIES = 64
DS_STRIDE = DS_KEYS + 8
DQ_KEYS = 64
DQ_STRIDE = DQ_KEYS + 8


def ds_panel_offset(m):
    blocks = m + ((m - 1) * (m - 1) // 4 if m >= 1 else 0)
    return blocks * DS_QUERIES * DS_KEYS


def frag_to_smem(s, stride, row0, col0, acc, kN, mul):
    """FragToSmem: acc[kM][kN/8] (32, 4) * mul as bf16 into s at rows row0.., cols col0.."""
    for mt in range(len(acc)):
        for nt in range(kN // 8):
            for h in range(2):
                r = row0 + mt * 16 + G + h * 8
                s[r * stride + col0 + nt * 8 + 2 * T4] = bf16(acc[mt][nt][:, 2 * h] * mul)
                s[r * stride + col0 + nt * 8 + 2 * T4 + 1] = bf16(acc[mt][nt][:, 2 * h + 1] * mul)


def mma_ab(acc, sA, sa, m0, sB, sb, n0, kM, kN, kK):
    for ks in range(kK // 16):
        a = [ldmatrix_x4(sA, (m0 + mt * 16 + (LANE & 15)) * sa + ks * 16 + (LANE >> 4) * 8)
             for mt in range(kM)]
        for np_ in range(kN // 16):
            b = ldmatrix_x4(sB, (ks * 16 + (MI & 1) * 8 + RI) * sb + n0 + np_ * 16 + (MI >> 1) * 8, trans=True)
            for mt in range(kM):
                mma(acc[mt][2 * np_], a[mt], b[0], b[1])
                mma(acc[mt][2 * np_ + 1], a[mt], b[2], b[3])


def mma_atb(acc, sA, sa, m0, sB, sb, n0, kM, kN, kK):
    for ks in range(kK // 16):
        a = [ldmatrix_x4(sA, (ks * 16 + (MI >> 1) * 8 + RI) * sa + m0 + mt * 16 + (MI & 1) * 8, trans=True)
             for mt in range(kM)]
        for np_ in range(kN // 16):
            b = ldmatrix_x4(sB, (ks * 16 + (MI & 1) * 8 + RI) * sb + n0 + np_ * 16 + (MI >> 1) * 8, trans=True)
            for mt in range(kM):
                mma(acc[mt][2 * np_], a[mt], b[0], b[1])
                mma(acc[mt][2 * np_ + 1], a[mt], b[2], b[3])


def backward_ds(qkv, dout, out, lse, B, T, H, D, scale):
    """flash_attention_backward_dkdv_ds_kernel then flash_attention_backward_dq_ds_kernel."""
    kD = 64 if D <= 64 else 128
    kS = kD + 8
    kDh = kD // 2
    C = H * D
    sl2 = np.float32(scale * LOG2E)
    dqkv = np.full((B, T, 3 * C), np.nan, np.float32)
    delta = np.zeros((B, H, T), np.float32)
    for b in range(B):
        for t in range(T):
            for h in range(H):
                delta[b, h, t] = np.float32(np.sum(out[b, t, h * D:h * D + D].astype(np.float64) *
                                                   dout[b, t, h * D:h * D + D]))
    n_qt = (T + DS_QUERIES - 1) // DS_QUERIES
    n_kb = (T + DS_KEYS - 1) // DS_KEYS
    for b in range(B):
        for h in range(H):
            g = qkv[b]
            gd = dout[b]
            ws = np.full(ds_panel_offset(n_qt), np.nan, np.float32)  # NaN: never written
            for kb in range(n_kb):
                k0 = kb * DS_KEYS
                sK = np.zeros(DS_KEYS * kS, np.float32)
                sV = np.zeros(DS_KEYS * kS, np.float32)
                load_tile(sK, 0, g, k0, T, D, kD, DS_KEYS, C + h * D)
                load_tile(sV, 0, g, k0, T, D, kD, DS_KEYS, 2 * C + h * D)
                dk = [zeros(2, kDh // 8) for _ in range(8)]
                dv = [zeros(2, kDh // 8) for _ in range(8)]
                for it in range(k0 // DS_QUERIES, n_qt):
                    q_base = it * DS_QUERIES
                    sQ = np.zeros(DS_QUERIES * kS, np.float32)
                    sdO = np.zeros(DS_QUERIES * kS, np.float32)
                    load_tile(sQ, 0, g, q_base, T, D, kD, DS_QUERIES, h * D)
                    load_tile(sdO, 0, gd, q_base, T, D, kD, DS_QUERIES, h * D)
                    sL = np.array([lse[b, h, q_base + i] * LOG2E if q_base + i < T else np.inf
                                   for i in range(DS_QUERIES)], np.float32)
                    sD = np.array([delta[b, h, q_base + i] if q_base + i < T else 0.0
                                   for i in range(DS_QUERIES)], np.float32)
                    sP = np.full(DS_QUERIES * DS_STRIDE, np.nan, np.float32)
                    sdS = np.full(DS_QUERIES * DS_STRIDE, np.nan, np.float32)
                    for w in range(8):
                        wm, wn = w & 1, w >> 1
                        p = zeros(2, 4)
                        dp = zeros(2, 4)
                        kw0 = k0 + wn * 32
                        if kw0 <= q_base + wm * 32 + 31:
                            mma_abt(p, sQ, 0, wm * 32, sK, wn * 32 * kS, kD, 2, 32)
                            mma_abt(dp, sdO, 0, wm * 32, sV, wn * 32 * kS, kD, 2, 32)
                            for mt in range(2):
                                for nt in range(4):
                                    for e in range(4):
                                        ql = wm * 32 + mt * 16 + G + (e >> 1) * 8
                                        key = kw0 + nt * 8 + 2 * T4 + (e & 1)
                                        pv = np.exp2(p[mt][nt][:, e] * sl2 - sL[ql])
                                        pv = np.where(key > q_base + ql, 0.0, pv)
                                        p[mt][nt][:, e] = pv
                                        dp[mt][nt][:, e] = pv * (dp[mt][nt][:, e] - sD[ql])
                        frag_to_smem(sP, DS_STRIDE, wm * 32, wn * 32, p, 32, 1.0)
                        frag_to_smem(sdS, DS_STRIDE, wm * 32, wn * 32, dp, 32, 1.0)
                    assert not np.isnan(sP.reshape(DS_QUERIES, DS_STRIDE)[:, :DS_KEYS]).any()
                    for w in range(8):
                        wk, wd = w & 3, w >> 2
                        mma_atb(dv[w], sP, DS_STRIDE, wk * 32, sdO, kS, wd * kDh, 2, kDh, DS_QUERIES)
                        mma_atb(dk[w], sdS, DS_STRIDE, wk * 32, sQ, kS, wd * kDh, 2, kDh, DS_QUERIES)
                    off = ds_panel_offset(it)
                    width = (it // 2 + 1) * DS_KEYS
                    for r in range(DS_QUERIES):
                        ws[off + r * width + k0:off + r * width + k0 + DS_KEYS] = sdS[r * DS_STRIDE:r * DS_STRIDE + DS_KEYS]
                oK = np.zeros(DS_KEYS * kS, np.float32)
                oV = np.zeros(DS_KEYS * kS, np.float32)
                for w in range(8):
                    wk, wd = w & 3, w >> 2
                    frag_to_smem(oK, kS, wk * 32, wd * kDh, dk[w], kDh, scale)
                    frag_to_smem(oV, kS, wk * 32, wd * kDh, dv[w], kDh, 1.0)
                for rr in range(DS_KEYS):
                    k = k0 + rr
                    if k < T:
                        dqkv[b, k, C + h * D:C + h * D + D] = oK[rr * kS:rr * kS + D]
                        dqkv[b, k, 2 * C + h * D:2 * C + h * D + D] = oV[rr * kS:rr * kS + D]
            # dQ from the dS panels
            for m in range(n_qt):
                q0 = m * DS_QUERIES
                off = ds_panel_offset(m)
                width = (m // 2 + 1) * DS_KEYS
                dq = [zeros(2, kDh // 8) for _ in range(4)]
                n_kv = (min(T, q0 + DS_QUERIES) + DQ_KEYS - 1) // DQ_KEYS
                for j in range(n_kv):
                    sK = np.zeros(DQ_KEYS * kS, np.float32)
                    load_tile(sK, 0, g, j * DQ_KEYS, T, D, kD, DQ_KEYS, C + h * D)
                    sdS = np.zeros(DS_QUERIES * DQ_STRIDE, np.float32)
                    for r in range(DS_QUERIES):
                        src = ws[off + r * width + j * DQ_KEYS:off + r * width + j * DQ_KEYS + DQ_KEYS]
                        assert src.size == DQ_KEYS and not np.isnan(src).any(), "dS read before written"
                        sdS[r * DQ_STRIDE:r * DQ_STRIDE + DQ_KEYS] = src
                    for w in range(4):
                        wm, wd = w & 1, w >> 1
                        mma_ab(dq[w], sdS, DQ_STRIDE, wm * 32, sK, kS, wd * kDh, 2, kDh, DQ_KEYS)
                oQ = np.zeros(DS_QUERIES * kS, np.float32)
                for w in range(4):
                    wm, wd = w & 1, w >> 1
                    frag_to_smem(oQ, kS, wm * 32, wd * kDh, dq[w], kDh, scale)
                for rr in range(DS_QUERIES):
                    q = q0 + rr
                    if q < T:
                        dqkv[b, q, h * D:h * D + D] = oQ[rr * kS:rr * kS + D]
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


# cuda_backend.h kFlashVariants: name -> (forward Bc 64 + FMA, dS-buffer backward)
VARIANTS = {"v1": (False, False), "fwd64": (True, False), "bwdds": (False, True), "v2": (True, True)}


def main():
    rng = np.random.default_rng(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
    only = sys.argv[2].split(",") if len(sys.argv) > 2 else None
    cases = [(1, 1, 2, 32), (1, 127, 3, 32), (2, 70, 1, 64), (1, 130, 2, 64), (1, 100, 2, 128),
             (1, 65, 1, 16), (1, 90, 2, 40), (1, 64, 1, 96), (1, 300, 1, 128), (1, 257, 1, 64)]
    ok = True
    print(f"{'var':>6} {'B':>2} {'T':>4} {'H':>2} {'D':>4}  {'out':>9} {'lse':>9} {'dq':>9} {'dk':>9} {'dv':>9}")
    for (B, T, H, D) in cases:
        C = H * D
        scale = 1.0 / np.sqrt(D)
        qkv = bf16(rng.uniform(-2, 2, (B, T, 3 * C)).astype(np.float32))
        dout = bf16(rng.uniform(-1, 1, (B, T, C)).astype(np.float32))
        r_out, r_lse, r_dqkv = reference(qkv, dout, B, T, H, D, scale)
        for variant in VARIANTS:
            if only and variant not in only:
                continue
            fwd_bc64, bwd_ds = VARIANTS[variant]
            out, lse = forward(qkv, B, T, H, D, scale, 64 if fwd_bc64 else None, fwd_bc64)
            # The backward gets the forward results as the kernels would (bf16 out).
            bw = backward_ds if bwd_ds else backward
            dqkv = bw(qkv, dout, bf16(out), lse, B, T, H, D, scale)
            e = [relerr(out, r_out), relerr(lse, r_lse)]
            for part in range(3):
                e.append(relerr(dqkv[:, :, part * C:(part + 1) * C], r_dqkv[:, :, part * C:(part + 1) * C]))
            bad = any(not (x < 1e-2) for x in e) or e[1] > 1e-5
            ok &= not bad
            print(f"{variant:>6} {B:>2} {T:>4} {H:>2} {D:>4}  " + " ".join(f"{x:9.2e}" for x in e) +
                  ("  FAIL" if bad else ""))
    print("all within tolerance" if ok else "FAILURES")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
