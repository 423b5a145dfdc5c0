"""Runs against a real `ctl-manager serve`: CTLD_SDK_URL, CTLD_SDK_KEY,
CTLD_SDK_OTHER_KEY (another owner's key) and CTLD_SDK_TEMPLATE,
CTLD_SDK_BLOCK_TEMPLATE (a block-mode template, for pause/resume)."""

import os
import unittest

from ctld_sandbox import APIError, Client


class SDKTest(unittest.TestCase):
    def setUp(self):
        self.c = Client(os.environ["CTLD_SDK_URL"], os.environ["CTLD_SDK_KEY"])
        self.other = Client(os.environ["CTLD_SDK_URL"], os.environ["CTLD_SDK_OTHER_KEY"])
        self.template = os.environ.get("CTLD_SDK_TEMPLATE", "busybox")

    def test_lifecycle(self):
        sb = self.c.create(template=self.template, labels={"sdk": "py"}, timeout_sec=600)
        self.assertEqual(sb.state, "ready")
        chunks = list(sb.run(["sh", "-c", "echo out; echo err >&2"]))
        self.assertIn(("stdout", b"out\n"), chunks)
        self.assertIn(("stderr", b"err\n"), chunks)
        self.assertEqual(sb.last_exit_code, 0)
        r = sb.exec(["cat"], stdin=b"piped")
        self.assertEqual((r.exit_code, r.stdout), (0, b"piped"))
        self.assertEqual(sb.exec(["sh", "-c", "exit 4"]).exit_code, 4)
        # code: the template serves sh (CTLD_SDK_TEMPLATE's languages).
        r = sb.code("sh", "echo from code\ncat", stdin=b"in\n")
        self.assertEqual((r.exit_code, r.stdout), (0, b"from code\nin\n"))
        with self.assertRaises(APIError) as cm:
            sb.code("cobol", "x")
        self.assertEqual((cm.exception.status, cm.exception.code), (400, "invalid_argument"))
        sb.files.mkdir("/w/d", parents=True)
        sb.files.write("/w/d/a", b"\x00binary\xff")
        self.assertEqual(sb.files.read("/w/d/a"), b"\x00binary\xff")
        self.assertEqual(sb.files.stat("/w/d/a")["size"], 8)
        sb.files.move("/w/d/a", "/w/b")
        self.assertEqual(sorted(e["name"] for e in sb.files.list("/w")), ["b", "d"])
        sb.files.remove("/w", recursive=True)
        self.assertIn(sb.id, [s.id for s in self.c.list(labels={"sdk": "py"})])
        with self.assertRaises(APIError) as cm:
            self.other.get(sb.id)
        self.assertEqual((cm.exception.status, cm.exception.code), (404, "not_found"))
        proof = sb.kill()
        self.assertTrue(proof["verified"] and proof["clean"])
        self.assertEqual(sb.state, "destroyed")

    def test_pause_resume(self):
        block = os.environ.get("CTLD_SDK_BLOCK_TEMPLATE")
        if not block:
            self.fail("CTLD_SDK_BLOCK_TEMPLATE not set")
        sb = self.c.create(template=block, idle_timeout_sec=3600)
        self.assertEqual(sb.snapshot("s1")["name"], "s1")
        self.assertEqual([s["name"] for s in sb.snapshots()], ["s1"])
        fork = sb.fork(snapshot="s1", labels={"from": "s1"})
        self.assertEqual((fork.state, fork.info["labels"]), ("ready", {"from": "s1"}))
        self.assertTrue(fork.kill()["verified"])
        self.assertEqual(sb.pause().state, "paused")
        self.assertEqual(sb.restore("s1").state, "paused")
        self.assertEqual(sb.resume().state, "ready")
        self.assertTrue(sb.kill()["verified"])

    def test_events_resume(self):
        sb = self.c.create(template=self.template)
        mine = []
        for ev in self.c.events(sandbox=sb.id, after=0):
            mine.append(ev)
            if ev["type"] == "ready":
                break
        self.assertEqual([e["type"] for e in mine], ["created", "ready"])
        sb.kill()
        # Resuming after "ready": only what came later.
        for ev in self.c.events(sandbox=sb.id, after=mine[-1]["seq"]):
            self.assertEqual((ev["type"], ev["seq"] > mine[-1]["seq"]), ("destroyed", True))
            break

    def test_volumes(self):
        v = self.c.create_volume("4Mi", labels={"sdk": "py"})
        self.assertEqual((v["state"], v["size_bytes"]), ("ready", 4 << 20))
        with self.assertRaises(APIError) as cm:
            self.other.volume(v["id"])
        self.assertEqual(cm.exception.code, "not_found")
        sb = self.c.create(template=self.template, volumes=[{"id": v["id"], "path": "/data"}])
        self.assertEqual(self.c.volume(v["id"])["held_by"], sb.id)
        with self.assertRaises(APIError) as cm:
            self.c.delete_volume(v["id"])
        self.assertEqual(cm.exception.code, "conflict")
        sb.kill()
        self.assertIn(v["id"], [x["id"] for x in self.c.volumes()])
        self.assertEqual(self.c.delete_volume(v["id"])["state"], "deleted")

    def test_errors(self):
        with self.assertRaises(APIError) as cm:
            Client(os.environ["CTLD_SDK_URL"], "ctl_wrong").templates()
        self.assertEqual(cm.exception.status, 401)
        with self.assertRaises(APIError) as cm:
            self.c.create(template=self.template, resources={"cpu": "lots"})
        self.assertEqual(cm.exception.code, "invalid_argument")
        key = "sdk-idem-1"
        a = self.c.create(template=self.template, idempotency_key=key)
        b = self.c.create(template=self.template, idempotency_key=key)
        self.assertEqual(a.id, b.id)
        a.kill()


if __name__ == "__main__":
    unittest.main()
