# SPDX-License-Identifier: Apache-2.0
"""ferry.Engine.pin: a call pinned to a decode's epoch never reaches the
process restarted on its port (PeerRestarted every time, nothing lands),
over tcp and shm; a re-pinned name works; malformed pins are argument
errors. (The Mooncake-compatible TransferEngine keeps Mooncake's rule:
test_sglang_sequences.TestDecodeRestartWithoutProbe.)"""

import mmap
import unittest

from _support import requires_engine
from test_pd_pair import PAGE, Decode, pattern, sha

import ferry
from ferry import errors

TRIES = 5


@requires_engine
class TestPinnedNames(unittest.TestCase):
    def restart(self, decode):
        sid = decode.session_id
        decode.kill()
        decode.close()
        try:
            return Decode("tcp", hostname=sid)
        except RuntimeError as exc:
            self.skipTest("could not restart on the same port: %s" % exc)

    def check_pinned_across_restart(self, transport):
        decode = Decode("tcp")
        eng = ferry.Engine(host="127.0.0.1", port=0, transport=transport, timeout_ms=3000,
                           connect_timeout_ms=2000)
        buf = mmap.mmap(-1, 2 * PAGE)
        try:
            addr = eng.register(buf)
            sid = decode.session_id
            pin1 = eng.pin(sid)
            self.assertEqual(pin1, "%s#%016x" % (sid, eng.session_info(sid).epoch))
            self.assertEqual(eng.session_info(pin1).transport, transport)
            buf[:PAGE] = pattern(PAGE, 1)
            eng.write(pin1, addr, decode.kv_addr, PAGE)
            self.assertEqual(decode.digests([(0, PAGE)]), [sha(buf[:PAGE])])

            decode = self.restart(decode)
            zero = [sha(bytes(PAGE))]
            buf[:PAGE] = pattern(PAGE, 2)
            # Even the new process's own addresses are refused under the old
            # pin: the pin says which process the caller means.
            for remote in (decode.kv_addr, decode.kv_addr + PAGE):
                for _ in range(TRIES):
                    with self.assertRaises(ferry.PeerRestarted):
                        eng.write(pin1, addr, remote, PAGE)
                    with self.assertRaises(ferry.PeerRestarted):
                        eng.read(pin1, addr + PAGE, remote, PAGE)
                    with self.assertRaises(ferry.PeerRestarted):
                        eng.write_batch(pin1, [addr], [remote], [PAGE])
                    with self.assertRaises(ferry.PeerRestarted):
                        with eng.batch(1) as b:
                            b.submit(pin1, [(ferry.WRITE, addr, remote, PAGE)])
                            b.wait(5000)
                    with self.assertRaises(ferry.PeerRestarted):
                        eng.notify(pin1, b"stale")
            self.assertIn("pinned to epoch", errors.last_error_detail())
            self.assertEqual(decode.digests([(0, PAGE), (PAGE, PAGE)]), zero * 2)

            pin2 = eng.pin(decode.session_id)
            self.assertNotEqual(pin2, pin1)
            eng.write(pin2, addr, decode.kv_addr, PAGE)
            self.assertEqual(decode.digests([(0, PAGE)]), [sha(buf[:PAGE])])
            with self.assertRaises(ferry.PeerRestarted):
                eng.write(pin1, addr, decode.kv_addr, PAGE)
        finally:
            decode.kill()
            decode.close()
            eng.close()

    def test_pinned_across_restart_tcp(self):
        self.check_pinned_across_restart("tcp")

    def test_pinned_across_restart_shm(self):
        self.check_pinned_across_restart("shm")

    def test_malformed_pins(self):
        eng = ferry.Engine(host="127.0.0.1", port=0, transport="tcp", timeout_ms=3000)
        try:
            for suffix in ("#", "#0x1", "#xyz", "#" + "1" * 17):
                with self.assertRaises(ferry.FerryError) as cm:
                    eng.ping(eng.name + suffix)
                self.assertEqual(cm.exception.code, errors.INVALID_ARGUMENT)
                with self.assertRaises(ferry.FerryError):
                    eng.pin(eng.name + suffix)
            # The engine's own name, pinned to its own epoch, is the pin.
            self.assertEqual(eng.pin(eng.name), "%s#%016x" % (eng.name, eng.epoch))
        finally:
            eng.close()


if __name__ == "__main__":
    unittest.main()
