"""Python client of the ctld sandbox service (`ctl-manager serve`, API /v1).

Standard library only (http.client). Example::

    from ctld_sandbox import Client
    c = Client("http://127.0.0.1:8080", key)
    sb = c.create(template="busybox", timeout_sec=600)
    for stream, chunk in sb.run(["sh", "-c", "echo hi"]):
        print(stream, chunk)
    sb.files.write("/tmp/a.txt", b"data")
    sb.kill()
"""

import base64
import json
import http.client
import urllib.parse

__all__ = ["Client", "Sandbox", "Files", "APIError", "RunResult"]


class APIError(Exception):
    """An error answer: code from the service's fixed set, HTTP status,
    message and the Retry-After hint in seconds (or None)."""

    def __init__(self, status, code, message, retry_after=None):
        super().__init__(f"{code} ({status}): {message}")
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after


class RunResult:
    def __init__(self, exit_code, stdout, stderr):
        self.exit_code, self.stdout, self.stderr = exit_code, stdout, stderr


class Client:
    """Calls the service with an API key."""

    def __init__(self, base_url, key, timeout=300):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https"):
            raise ValueError("base_url must be http:// or https://")
        self._scheme, self._netloc, self._key, self._timeout = u.scheme, u.netloc, key, timeout

    def _conn(self):
        cls = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return cls(self._netloc, timeout=self._timeout)

    def _open(self, method, path, query=None, body=None, headers=None):
        """Sends a request; returns (connection, response) of a 2xx answer."""
        if query:
            path += "?" + urllib.parse.urlencode(query, doseq=True)
        h = {"Authorization": "Bearer " + self._key}
        h.update(headers or {})
        conn = self._conn()
        conn.request(method, path, body=body, headers=h)
        resp = conn.getresponse()
        if resp.status // 100 != 2:
            raw = resp.read(64 << 10)
            conn.close()
            try:
                err = json.loads(raw)["error"]
                code, msg = err["code"], err["message"]
            except (ValueError, KeyError, TypeError):
                code, msg = "internal", raw.decode("utf-8", "replace")
            ra = resp.getheader("Retry-After")
            raise APIError(resp.status, code, msg, int(ra) if ra and ra.isdigit() else None)
        return conn, resp

    def _json(self, method, path, body=None, query=None, idempotency_key=None):
        headers = {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        conn, resp = self._open(method, path, query, data, headers)
        try:
            raw = resp.read()
        finally:
            conn.close()
        return json.loads(raw) if raw else None

    def create(self, template, wait=True, idempotency_key=None, **spec):
        """Creates a sandbox (spec: resources, network, env, args, cwd,
        user, labels, timeout_sec, idle_timeout_sec, volumes, on_exit:
        "keep" or "destroy") and returns
        it once ready."""
        body = dict(spec, template=template)
        q = None if wait else {"wait": "false"}
        return Sandbox(self, self._json("POST", "/v1/sandboxes", body, q, idempotency_key))

    def get(self, sandbox_id):
        return Sandbox(self, self._json("GET", _sb(sandbox_id)))

    def list(self, state=None, labels=None, limit=None):
        """Yields every sandbox of the caller (following the pages)."""
        q = {}
        if state:
            q["state"] = state
        if labels:
            q["label"] = [f"{k}={v}" for k, v in labels.items()]
        if limit:
            q["limit"] = str(limit)
        while True:
            page = self._json("GET", "/v1/sandboxes", query=q)
            for s in page["sandboxes"]:
                yield Sandbox(self, s)
            if not page.get("next_cursor"):
                return
            q["cursor"] = page["next_cursor"]

    def templates(self):
        return self._json("GET", "/v1/templates")["templates"]

    def events(self, sandbox=None, after=None):
        """Yields the caller's sandbox events (dicts with seq, type,
        sandbox_id, reason, time) as they happen; with after (an event's
        seq, 0 for all kept) the journaled events after it come first, so
        a follower resumes where it stopped, across server restarts. Runs
        until the stream ends or the caller stops iterating."""
        q = {}
        if sandbox:
            q["sandbox"] = sandbox
        if after is not None:
            q["after"] = str(after)
        conn, resp = self._open("GET", "/v1/events", q, None, {"Accept": "text/event-stream"})
        try:
            for name, data in _events(resp):
                if name == "error":
                    err = json.loads(data)["error"]
                    raise APIError(200, err["code"], err["message"])
                yield json.loads(data)
        finally:
            conn.close()

    def create_volume(self, size, labels=None, idempotency_key=None):
        """Creates a persistent volume (an empty ext4 file system of size,
        e.g. "1Gi"); mount it with create(volumes=[{"id": v["id"],
        "path": "/data"}]). Returns the volume (a dict)."""
        body = {"size": size}
        if labels:
            body["labels"] = labels
        return self._json("POST", "/v1/volumes", body, idempotency_key=idempotency_key)

    def volume(self, volume_id):
        return self._json("GET", _vol(volume_id))

    def volumes(self):
        """Yields every volume of the caller (following the pages)."""
        q = {}
        while True:
            page = self._json("GET", "/v1/volumes", query=q)
            yield from page["volumes"]
            if not page.get("next_cursor"):
                return
            q["cursor"] = page["next_cursor"]

    def delete_volume(self, volume_id, idempotency_key=None):
        """Deletes a volume no sandbox holds; returns it (state deleted)."""
        return self._json("DELETE", _vol(volume_id), idempotency_key=idempotency_key)


def _vol(volume_id):
    return "/v1/volumes/" + urllib.parse.quote(volume_id, safe="")


def _sb(sandbox_id, rest=""):
    return "/v1/sandboxes/" + urllib.parse.quote(sandbox_id, safe="") + rest


def _events(resp):
    """Yields (event, data) of a text/event-stream response."""
    name, data = None, []
    while True:
        line = resp.readline(4 << 20)
        if not line:
            return
        line = line.rstrip(b"\r\n").decode()
        if line.startswith("event:"):
            name = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].strip())
        elif line == "" and name:
            yield name, "".join(data)
            name, data = None, []


class Sandbox:
    """A sandbox of the caller's owner."""

    def __init__(self, client, info):
        self._c, self.info = client, info
        self.id = info["id"]
        self.files = Files(client, self.id)

    @property
    def state(self):
        return self.info["state"]

    def refresh(self):
        self.info = self._c._json("GET", _sb(self.id))
        return self

    def run(self, args, stdin=None, env=None, timeout_sec=None):
        """Runs a command, yielding ("stdout"|"stderr", bytes) as output
        comes; the generator's return value (StopIteration.value) and
        self.last_exit_code are the exit code."""
        body = {"args": list(args)}
        return (yield from self._stream("/exec", body, stdin, env, timeout_sec))

    def run_code(self, language, source, stdin=None, env=None, timeout_sec=None):
        """Runs a snippet of source in a language the sandbox's template
        serves (python, node, bash, sh), yielding output as run does."""
        body = {"language": language, "source": source}
        return (yield from self._stream("/code", body, stdin, env, timeout_sec))

    def code(self, language, source, stdin=None, env=None, timeout_sec=None):
        """Runs a snippet and returns a RunResult with all its output."""
        out, err = bytearray(), bytearray()
        for name, chunk in self.run_code(language, source, stdin, env, timeout_sec):
            (out if name == "stdout" else err).extend(chunk)
        return RunResult(self.last_exit_code, bytes(out), bytes(err))

    def _stream(self, path, body, stdin, env, timeout_sec):
        if stdin is not None:
            body["stdin"] = base64.b64encode(stdin).decode()
        if env:
            body["env"] = env
        if timeout_sec:
            body["timeout_sec"] = timeout_sec
        conn, resp = self._c._open("POST", _sb(self.id, path), body=json.dumps(body).encode(),
                                   headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        try:
            for name, data in _events(resp):
                if name in ("stdout", "stderr"):
                    yield name, base64.b64decode(data)
                elif name == "exit":
                    self.last_exit_code = json.loads(data)["exit_code"]
                    return self.last_exit_code
                elif name == "error":
                    e = json.loads(data)["error"]
                    raise APIError(200, e["code"], e["message"])
            raise APIError(200, "unavailable", "exec stream ended without an exit event")
        finally:
            conn.close()

    def exec(self, args, stdin=None, env=None, timeout_sec=None):
        """Runs a command and returns a RunResult with all its output."""
        out, err = bytearray(), bytearray()
        gen = self.run(args, stdin, env, timeout_sec)
        for name, chunk in gen:
            (out if name == "stdout" else err).extend(chunk)
        return RunResult(self.last_exit_code, bytes(out), bytes(err))

    def pause(self, idempotency_key=None):
        self.info = self._c._json("POST", _sb(self.id, "/pause"), idempotency_key=idempotency_key)
        return self

    def resume(self, idempotency_key=None):
        self.info = self._c._json("POST", _sb(self.id, "/resume"), idempotency_key=idempotency_key)
        return self

    def snapshot(self, name, idempotency_key=None):
        """Seals a running block-mode sandbox's files under name."""
        return self._c._json("POST", _sb(self.id, "/snapshots"), {"name": name}, idempotency_key=idempotency_key)

    def snapshots(self):
        return self._c._json("GET", _sb(self.id, "/snapshots"))["snapshots"]

    def restore(self, snapshot, idempotency_key=None):
        """Moves a paused sandbox's files to its snapshot (resume runs it)."""
        self.info = self._c._json("POST", _sb(self.id, "/restore"), {"snapshot": snapshot}, idempotency_key=idempotency_key)
        return self

    def fork(self, snapshot=None, idempotency_key=None, **spec):
        """A new sandbox (labels, timeout_sec) from the snapshot, or the
        last published head; returned once ready."""
        body = dict(spec)
        if snapshot:
            body["snapshot"] = snapshot
        return Sandbox(self._c, self._c._json("POST", _sb(self.id, "/fork"), body, idempotency_key=idempotency_key))

    def set_timeout(self, timeout_sec):
        self.info = self._c._json("POST", _sb(self.id, "/timeout"), {"timeout_sec": timeout_sec})
        return self

    def kill(self, idempotency_key=None):
        """Destroys the sandbox; returns the cleanup proof with the
        manager's verdict (proof["verified"], proof["clean"])."""
        r = self._c._json("DELETE", _sb(self.id), idempotency_key=idempotency_key)
        self.info = r["sandbox"]
        return r["proof"]


class Files:
    """The guest's files."""

    def __init__(self, client, sandbox_id):
        self._c, self._id = client, sandbox_id

    def read(self, path):
        conn, resp = self._c._open("GET", _sb(self._id, "/files"), {"path": path})
        try:
            return resp.read()
        finally:
            conn.close()

    def write(self, path, data):
        conn, resp = self._c._open("PUT", _sb(self._id, "/files"), {"path": path}, data,
                                   {"Content-Type": "application/octet-stream", "Content-Length": str(len(data))})
        resp.read()
        conn.close()

    def list(self, path):
        return self._c._json("GET", _sb(self._id, "/files/list"), query={"path": path})["entries"]

    def stat(self, path):
        return self._c._json("GET", _sb(self._id, "/files/stat"), query={"path": path})

    def mkdir(self, path, parents=False):
        self._c._json("POST", _sb(self._id, "/files/mkdir"), {"path": path, "parents": parents})

    def remove(self, path, recursive=False):
        self._c._json("POST", _sb(self._id, "/files/remove"), {"path": path, "recursive": recursive})

    def move(self, src, dst):
        self._c._json("POST", _sb(self._id, "/files/move"), {"from": src, "to": dst})
