"""`trainctl web`'s application (Starlette): the pages, their JSON, and the guards.

Guards, each checked before any route runs:

- **Host**: only the names this server was reached by on purpose (127.0.0.1, localhost,
  [::1], or the --bind address, with its port). A DNS-rebinding page, whose requests carry
  its own host name, gets 403.
- **Token**: a random token, printed in the URL as Jupyter does. The first visit with
  ``?token=`` gets an HttpOnly, SameSite=Strict cookie and a redirect to the bare URL (so
  the token leaves the address bar and no Referer carries it). A script may send
  ``Authorization: Bearer TOKEN`` instead. Anything else gets 403.
- **CSRF**: an action (POST) must also carry the token in ``X-Trainctl-Token``, which a
  page of another origin cannot set, and an Origin, when sent, must be this one.
- **Read-only** unless ``--allow`` names the action (stop, restart, deploy), as for
  `trainctl mcp`. An action runs the verb's own code in this process (as `trainctl mcp`
  does; the job name checked first), its text to a sink of its own, never a shell.
"""

from __future__ import annotations

import json
import secrets
import socket
from collections.abc import Awaitable, Callable, MutableMapping
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

import anyio.to_thread
import psutil
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from trainctl.launcher import render
from trainctl.launcher.ops import runview
from trainctl.launcher.ops.history import job_history
from trainctl.launcher.ops.status import all_statuses, job_status
from trainctl.launcher.results import Status
from trainctl.launcher.results.ops import CheckpointFile, HistoryRow
from trainctl.supervisor.errors import ConfigError, JobNotFoundError, TrainctlError
from trainctl.supervisor.model import state
from trainctl.supervisor.records import JsonObject, record

from . import pages, static
from .goodput import GoodputLines

COOKIE = "trainctl_token"
Scope = MutableMapping[str, Any]
ASGI = Callable[
    [Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]
HEADERS = {
    "content-security-policy": "default-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "referrer-policy": "no-referrer",
    "x-content-type-options": "nosniff",
    "cache-control": "no-store",
}


@record(frozen=True)
class WebConfig:
    """What one server serves and allows."""

    home: Path
    token: str
    hosts: frozenset[str]  # acceptable Host headers (with their port)
    allowed: frozenset[str]  # actions: stop, restart, deploy
    # runs an action in this process (the verb, given by the verb layer above this one):
    # (what, job) -> {"ok", "exit_code", "error", "report"}
    act: Callable[[str, str], JsonObject] | None = None


def allowed_hosts(bind: str, port: int) -> frozenset[str]:
    """The Host headers a browser sends to this server when it was meant to reach it: the
    loopback names, the --bind address, and for a wildcard bind this host's own names and
    addresses (what someone on the network types), never a name it does not own."""
    names = {"127.0.0.1", "localhost", "[::1]"}
    if bind in ("0.0.0.0", "::"):  # noqa: S104  (a name to compare, not a bind)
        names |= {socket.gethostname(), socket.getfqdn()}
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    ip = a.address.split("%", 1)[0]
                    names.add(f"[{ip}]" if ":" in ip else ip)
    else:
        names.add(f"[{bind}]" if ":" in bind else bind)
    return frozenset(f"{n}:{port}" for n in names)


class Guard:
    """The ASGI wrapper that checks Host, token and CSRF before the app sees a request."""

    def __init__(self, app: ASGI, cfg: WebConfig) -> None:
        self.app, self.cfg = app, cfg

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refusal(scope, headers)
        if isinstance(refusal, Response):
            await refusal(scope, receive, send)
            return

        async def secured(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [
                    *message.get("headers", []),
                    *((k.encode(), v.encode()) for k, v in HEADERS.items()),
                ]
            await send(message)

        await self.app(scope, receive, secured)

    def _refusal(self, scope: Scope, headers: dict[str, str]) -> Response | None:
        if headers.get("host", "") not in self.cfg.hosts:
            return PlainTextResponse("403: a foreign Host header (DNS rebinding?)", 403)
        cookie = SimpleCookie(headers.get("cookie", ""))
        given = cookie[COOKIE].value if COOKIE in cookie else ""
        bearer = headers.get("authorization", "")
        if not given and bearer.startswith("Bearer "):  # a script: curl -H 'Authorization: ...'
            given = bearer.removeprefix("Bearer ")
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        in_url = (query.get("token") or [""])[0]
        if in_url and secrets.compare_digest(in_url, self.cfg.token):
            return _with_cookie(scope, query, self.cfg.token)
        if not given or not secrets.compare_digest(given, self.cfg.token):
            return PlainTextResponse("403: no valid token (open the URL trainctl web printed)", 403)
        if scope["method"] not in ("GET", "HEAD"):
            sent = headers.get("x-trainctl-token", "")
            if not sent or not secrets.compare_digest(sent, self.cfg.token):
                return PlainTextResponse("403: an action needs the page's token header", 403)
            origin = headers.get("origin")
            if origin is not None and origin != f"http://{headers['host']}":
                return PlainTextResponse("403: a request from another origin", 403)
        return None


def _with_cookie(scope: Scope, query: dict[str, list[str]], token: str) -> Response:
    """The first visit: set the cookie, then the same page without the token in its URL."""
    rest = {k: v for k, v in query.items() if k != "token"}
    target = scope["path"] + (f"?{urlencode(rest, doseq=True)}" if rest else "")
    response = Response(status_code=303, headers={"location": target})
    response.set_cookie(COOKIE, token, httponly=True, samesite="strict", path="/")
    return response


def serve(cfg: WebConfig, sock: socket.socket) -> None:
    """Serve on ``sock`` until Ctrl-C (uvicorn: one process, one event loop)."""
    server = uvicorn.Server(uvicorn.Config(build_app(cfg), log_level="warning", lifespan="off"))
    server.run(sockets=[sock])


def build_app(cfg: WebConfig) -> Guard:
    """The application, behind its guard."""
    web = _Web(cfg)
    routes = [
        Route("/", web.jobs),
        Route("/app.js", web.script),
        Route("/app.css", web.style),
        Route("/api/jobs", web.jobs_json),
        Route("/jobs/{name}", web.job),
        Route("/jobs/{name}/charts", web.charts),
        Route("/jobs/{name}/stop", web.stop),
        Route("/api/jobs/{name}", web.job_json),
        Route("/api/jobs/{name}/log", web.log),
        Route("/api/jobs/{name}/stop", web.stop_json),
        Route("/api/jobs/{name}/{action}", web.action, methods=["POST"]),
    ]
    return Guard(Starlette(routes=routes), cfg)


class _Web:
    """The routes; each reads files in a worker thread (the loop stays free)."""

    def __init__(self, cfg: WebConfig) -> None:
        self.cfg = cfg
        self.goodput = GoodputLines(cfg.home)
        self.points = runview.TailCache()

    async def script(self, _: Request) -> Response:
        return Response(static.JS, media_type="text/javascript")

    async def style(self, _: Request) -> Response:
        return Response(static.CSS, media_type="text/css")

    async def jobs(self, _: Request) -> Response:
        rows = await anyio.to_thread.run_sync(all_statuses, self.cfg.home)
        return HTMLResponse(pages.jobs_page(rows, str(self.cfg.home), self.cfg.token))

    async def jobs_json(self, _: Request) -> Response:
        rows = await anyio.to_thread.run_sync(all_statuses, self.cfg.home)
        return JSONResponse([pages.job_row(r) for r in rows])

    async def job(self, request: Request) -> Response:
        return await _guarded(self._job_page, request.path_params["name"])

    def _charts(self, name: str, s: Status) -> tuple[str, list[CheckpointFile], list[HistoryRow]]:
        """The job's charts, and the checkpoints and runs marked on them."""
        ckpts = runview.checkpoints(self.cfg.home, name)
        history = job_history(self.cfg.home, name)
        samples = runview.job_samples(self.cfg.home, name)  # every run, boundaries marked
        # every point the trainer wrote (the newest of them): each file parsed once
        points = runview.progress_points(self.cfg.home, name, cache=self.points)
        line = self.goodput.line(name)  # made off the request: a week of lines is not read
        return pages.chart_set(samples, points, ckpts, s, history, line), ckpts, history

    def _job_page(self, name: str) -> Response:
        s = job_status(self.cfg.home, name)
        charts, ckpts, history = self._charts(name, s)
        stacks = [
            (label, render.stacks(report))
            for label, path in (
                ("at the stall", s.stall_stacks),
                ("before SIGKILL", getattr(s.last_stop, "stacks", None)),
            )
            if (report := runview.stored_stacks(path, name, s.run)) is not None
        ]
        html = pages.job_page(s, charts, ckpts, history, stacks, self.cfg.allowed, self.cfg.token)
        return HTMLResponse(html)

    async def charts(self, request: Request) -> Response:
        def draw(name: str) -> Response:
            return HTMLResponse(self._charts(name, job_status(self.cfg.home, name, brief=True))[0])

        return await _guarded(draw, request.path_params["name"])

    async def stop(self, request: Request) -> Response:
        def draw(name: str) -> Response:
            t = runview.stop_timeline(self.cfg.home, name)
            if t is None:
                return PlainTextResponse(f"job {name} has had no stop yet", 404)
            return HTMLResponse(pages.stop_page(t, self.cfg.token))

        return await _guarded(draw, request.path_params["name"])

    async def stop_json(self, request: Request) -> Response:
        def doc(name: str) -> Response:
            t = runview.stop_timeline(self.cfg.home, name)
            if t is None:
                return JSONResponse({"error": f"job {name} has had no stop yet"}, 404)
            return JSONResponse(t.to_doc())

        return await _guarded(doc, request.path_params["name"])

    async def job_json(self, request: Request) -> Response:
        def doc(name: str) -> Response:
            doc = job_status(self.cfg.home, name).to_doc()  # as `status --json` writes it
            return Response(json.dumps(doc, default=str), media_type="application/json")

        return await _guarded(doc, request.path_params["name"])

    async def log(self, request: Request) -> Response:
        raw = request.query_params.get("offset")
        offset = int(raw) if raw is not None and raw.isdigit() else None

        def tail(name: str) -> Response:
            t = runview.log_tail(self.cfg.home, name, offset)
            doc = {"log": t.log, "offset": t.offset, "lines": t.lines, "partial": t.partial}
            return JSONResponse(doc)

        return await _guarded(tail, request.path_params["name"])

    async def action(self, request: Request) -> Response:
        what = request.path_params["action"]
        if what not in pages.ACTIONS:
            return JSONResponse({"ok": False, "error": f"no action {what!r}"}, 404)
        if what not in self.cfg.allowed:
            return JSONResponse(
                {
                    "ok": False,
                    "error": f"{what} is not allowed: start `trainctl web --allow {what}`",
                },
                403,
            )
        return await _guarded(lambda name: self._act(what, name), request.path_params["name"])

    def _act(self, what: str, name: str) -> Response:
        """The action, run in this process by the verb's own code (its output to a sink
        of the request's, not to the server's stdout), answered with its exit code, its
        one error line and its --json document."""
        if self.cfg.act is None:
            return JSONResponse({"ok": False, "error": "this server runs no actions"}, 403)
        # the verb's document as it is (a path or a time in it written as --json writes it)
        body = json.dumps(self.cfg.act(what, name), default=str)
        return Response(body, media_type="application/json")


async def _guarded(make: Callable[[str], Response], name: str) -> Response:
    """Run a route's reads in a thread; a bad name or a missing job is a 404 with its line."""
    try:
        state.check_name(name)
        return await anyio.to_thread.run_sync(make, name)
    except (ConfigError, JobNotFoundError) as e:
        return PlainTextResponse(str(e), 404)
    except TrainctlError as e:
        return PlainTextResponse(str(e), 409)
