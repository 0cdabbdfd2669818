# SPDX-License-Identifier: Apache-2.0
"""strata.TierStore through libstrata.so: data round trips through host and
NVMe from every kind of buffer, tickets, views, stats, and the errors (each
a strata.Error subclass with its code, errno, path, tier, bytes)."""

import array
import errno
import os
import shutil
import tempfile
import unittest

import strata

try:
    import numpy
except ImportError:  # numpy is optional
    numpy = None

KIB, MIB = 1 << 10, 1 << 20


def temp_dir():
    # On disk (O_DIRECT works there, unlike tmpfs), as tests/test_util.h does.
    return tempfile.mkdtemp(prefix="strata-py-", dir=os.environ.get("TMPDIR") or "/var/tmp")


def small_store(directory, host_budget=MIB, nvme=True, **kw):
    opts = dict(gpu=True, gpu_stand_in=True, gpu_budget_bytes=MIB, gpu_slab_bytes=0,
                host_budget_bytes=host_budget, host_slab_bytes=0, host_pin=False,
                staging_chunk_bytes=64 * KIB, staging_buffers=2, staging_per_move=2)
    if nvme:
        opts.update(nvme_dirs=[directory], nvme_capacity_bytes=16 * MIB, nvme_block_size=64 * KIB,
                    nvme_queue_depth=8, nvme_buffered_fallback=True)
    opts.update(kw)
    return strata.TierStore(**opts)


def pattern(n, seed):
    return bytearray((i * 131 + seed * 17 + (i >> 8)) & 0xFF for i in range(n))


class StoreTest(unittest.TestCase):
    def setUp(self):
        self.dir = temp_dir()

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_round_trip_through_host_and_nvme(self):
        with small_store(self.dir) as store:
            n = 200000  # not a multiple of 4096
            host = store.create("host.t", "u8", (n,), home="host")
            disk = store.create("nvme.t", "u8", (n,), home="nvme")
            a, b = pattern(n, 1), pattern(n, 2)
            host.write(a)
            disk.write(bytes(b))  # read-only bytes are used in place
            ticket = disk.evict("host")
            ticket.wait()
            self.assertTrue(ticket.poll())
            info = disk.info()
            self.assertFalse(info["copies"]["host"]["allocated"])
            self.assertTrue(info["copies"]["nvme"]["valid"])
            self.assertEqual(info["shape"], (n,))
            self.assertEqual(info["home"], "nvme")
            stats = store.stats()
            io_bytes = (n + 4095) // 4096 * 4096
            self.assertEqual(stats["links"]["host_to_nvme"]["bytes"], io_bytes)
            self.assertEqual(stats["tiers"]["nvme"]["budget"], 16 * MIB)
            self.assertEqual(stats["tensors"], 2)
            self.assertEqual(disk.read(), b)
            out = bytearray(n)
            host.read_into(memoryview(out))
            self.assertEqual(out, a)
            self.assertEqual(store.stats()["links"]["nvme_to_host"]["bytes"], io_bytes)
            self.assertIs(store.gpu_is_device, False)  # the stand-in

    def test_typed_buffers(self):
        with small_store(self.dir) as store:
            t = store.create("w", "f32", (4, 25), home="nvme")
            src = array.array("f", [i * 0.25 - 3 for i in range(100)])
            t.write(src)
            t.evict("host").wait()
            t.prefetch("gpu").wait()  # nvme -> gpu through staging
            dst = array.array("f", [0.0] * 100)
            t.read_into(dst)
            self.assertEqual(dst, src)
            if numpy is not None:
                arr = numpy.arange(100, dtype=numpy.float32).reshape(4, 25)
                t.write(arr)
                back = numpy.zeros((4, 25), dtype=numpy.float32)
                t.read_into(back)
                self.assertTrue((back == arr).all())
                with self.assertRaises(strata.InvalidArgumentError):
                    t.read_into(numpy.zeros((25, 8), dtype=numpy.float32)[:, :4])  # not contiguous
            with self.assertRaises(TypeError):
                t.read_into(bytes(400))  # read-only destination
            with self.assertRaises(strata.InvalidArgumentError) as cm:
                t.write(bytearray(12))
            self.assertIn("write of 12 bytes to tensor 'w' of 400 bytes", cm.exception.message)

    def test_views_and_conflicts(self):
        with small_store(self.dir) as store:
            t = store.create("v", "u8", (8192,), home="nvme")
            data = pattern(8192, 3)
            with t.acquire("host", "write_discard") as view:
                self.assertEqual(view.nbytes, 8192)
                self.assertFalse(view.device_memory)
                view.memory[:] = data
                with self.assertRaises(strata.FailedPreconditionError) as cm:
                    t.acquire("host", "read")
                self.assertIn("'v'", cm.exception.message)
                with self.assertRaises(strata.FailedPreconditionError):
                    t.remove()
            t.flush().wait()
            with t.acquire("gpu", "read") as view:  # the stand-in: host memory
                self.assertEqual(bytes(view.memory), bytes(data))
            with self.assertRaises(strata.InvalidArgumentError) as cm:
                t.acquire("nvme")
            self.assertIn("cannot be acquired", cm.exception.message)
            t.set_next_use(5)
            t.clear_next_use()
            store.flush_all()
            t.remove()
            with self.assertRaises(strata.NotFoundError):
                store.find("v")

    def test_errors_carry_their_details(self):
        with small_store(self.dir, nvme=False) as store:
            with self.assertRaises(strata.NotFoundError) as cm:
                store.find("missing")
            e = cm.exception
            self.assertIsInstance(e, strata.Error)
            self.assertEqual(e.code, strata.errors.NOT_FOUND)
            self.assertEqual(e.message, "no tensor named 'missing'")
            self.assertEqual(str(e), "NotFound: no tensor named 'missing'")
            self.assertIsNone(e.offset)
            store.create("t", "f32", (4,))
            with self.assertRaises(strata.AlreadyExistsError):
                store.create("t", "f32", (4,))
            with self.assertRaises(strata.InvalidArgumentError) as cm:
                store.create("u", "complex64", (4,))
            self.assertIn("dtype 'complex64'", cm.exception.message)
            with self.assertRaises(strata.InvalidArgumentError) as cm:
                store.create("u", 42, (4,))  # a raw value: the library's check
            self.assertIn("dtype 42 is not a strata_dtype", cm.exception.message)
            with self.assertRaises(strata.InvalidArgumentError) as cm:
                store.create("u", "f32", (4,), home="nvme")
            self.assertIn("home tier nvme is not configured", cm.exception.message)
            with self.assertRaises(strata.OutOfMemoryError) as cm:
                store.create("big", "u8", (4 * MIB,), home="host")
            e = cm.exception
            self.assertEqual(e.tier, "host")
            self.assertEqual(e.bytes_requested, 4 * MIB)
            self.assertLess(e.bytes_available, e.bytes_requested)
            self.assertIn("tier host", str(e))
        with self.assertRaises(strata.FailedPreconditionError):
            store.find("t")  # closed

    def test_open_errors(self):
        missing = os.path.join(self.dir, "nope")
        with self.assertRaises(strata.NotFoundError) as cm:
            small_store(missing)
        self.assertIn(missing, cm.exception.message)
        plain = os.path.join(self.dir, "file")
        open(plain, "w").close()
        with self.assertRaises(strata.IoError) as cm:
            small_store(os.path.join(plain, "sub"))
        self.assertEqual(cm.exception.errno, errno.ENOTDIR)
        self.assertEqual(cm.exception.path, os.path.join(plain, "sub"))
        with self.assertRaises(TypeError):
            small_store(self.dir, no_such_option=1)
        with self.assertRaises(strata.InvalidArgumentError):
            small_store(self.dir, nvme_checksum="md5")

    def test_ticket_outlives_store(self):
        store = small_store(self.dir)
        t = store.create("late", "u8", (64 * KIB,), home="nvme")
        t.write(pattern(64 * KIB, 4))
        ticket = t.flush()
        store.close()
        try:
            ticket.wait()
        except strata.CancelledError:
            pass  # cancelled by the close: also a clean answer
        ticket.free()
        with self.assertRaises(strata.FailedPreconditionError):
            ticket.wait()


if __name__ == "__main__":
    unittest.main()
