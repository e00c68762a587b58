"""A kernel in a user's single-user server, driven as a notebook front end drives it through
JupyterHub: started and shut down over the server's REST API, code sent over its kernel
websocket (the Jupyter messaging protocol as JSON), all through the Hub's proxy with the
user's token."""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timezone
from typing import Any

import websocket
from hub_server import Hub


class HubKernel:
    """``with HubKernel(hub, user, token) as k``: a new kernel of ``user``'s server, shut down
    on exit."""

    def __init__(self, hub: Hub, user: str, token: str) -> None:
        self.hub, self.user, self.token = hub, user, token
        self.base = f"/user/{user}/api/kernels"
        self.session = uuid.uuid4().hex
        self.kernel_id = ""
        self.socket: websocket.WebSocket | None = None

    def __enter__(self) -> HubKernel:
        status, kernel = self.hub.request("POST", self.base, self.token, {"name": "python3"})
        if status != 201:
            raise RuntimeError(f"starting a kernel in {self.user}'s server: HTTP {status}\n{self.hub.log()}")
        self.kernel_id = kernel["id"]
        url = self.hub.url.replace("http://", "ws://") + f"{self.base}/{self.kernel_id}/channels"
        self.socket = websocket.create_connection(
            f"{url}?session_id={self.session}", header=[f"Authorization: token {self.token}"], timeout=60
        )
        return self

    def execute(self, code: str, timeout: float) -> str:
        """Run ``code``; its stdout. Raises with the traceback if it failed, or past ``timeout``."""
        assert self.socket is not None
        msg_id = uuid.uuid4().hex
        self.socket.send(json.dumps(self._request(msg_id, code)))
        out: list[str] = []
        errors: list[str] = []
        replied = idle = False
        deadline = time.monotonic() + timeout
        while not (replied and idle):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{self.user}'s kernel did not answer within {timeout} s:\n{code}")
            self.socket.settimeout(left)
            frame = self.socket.recv()
            if isinstance(frame, bytes):  # a message with binary buffers (a widget's image): not ours to read
                continue
            message = json.loads(frame)
            if message.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind, content = message["msg_type"], message["content"]
            if kind == "stream" and content["name"] == "stdout":
                out.append(content["text"])
            elif kind == "error":
                errors.append("\n".join(content["traceback"]))
            elif kind == "execute_reply":
                replied = True
                if content["status"] != "ok" and not errors:
                    errors.append(f"{content.get('ename')}: {content.get('evalue')}")
            elif kind == "status" and content["execution_state"] == "idle":
                idle = True
        if errors:
            raise RuntimeError(f"{self.user}'s kernel failed:\n{code}\n" + "\n".join(errors))
        return "".join(out)

    def _request(self, msg_id: str, code: str) -> dict[str, Any]:
        """An ``execute_request`` on the shell channel, as the websocket's JSON carries it."""
        header = {
            "msg_id": msg_id,
            "msg_type": "execute_request",
            "username": self.user,
            "session": self.session,
            "date": datetime.now(timezone.utc).isoformat(),
            "version": "5.3",
        }
        content = {"code": code, "silent": False, "store_history": True, "user_expressions": {}, "allow_stdin": False}
        return {
            "header": header,
            "parent_header": {},
            "metadata": {},
            "content": {**content, "stop_on_error": True},
            "channel": "shell",
            "buffers": [],
        }

    def __exit__(self, *exc: object) -> None:
        if self.socket is not None:
            self.socket.close()
        if self.kernel_id:
            self.hub.request("DELETE", f"{self.base}/{self.kernel_id}", self.token)
