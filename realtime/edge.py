"""Serving the app: every answer aiohttp makes outside the app's middlewares is JSON too.

aiohttp answers requests it cannot parse (a bad request line, a header too long, a bogus
Content-Length) before any middleware runs, with a text/plain body, and logs each at ERROR
with a traceback: anyone can fill the log by sending garbage. `JsonErrorRequestHandler`
answers them like every other error (`{"error": reason}`) and logs one INFO line; a real
500 (a bug) still logs its traceback. The `Expect` header is also handled before the
middlewares (a text/plain 417, or a 500 when its value is not UTF-8, as the fuzz test
found): `_outermost` answers it, and any HTTP error raised out there, in JSON.
`FacecastRunner` is `web.AppRunner` with both; `run_app` is `web.run_app` with that
runner (aiohttp's takes no runner class).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger("realtime.http")


class JsonErrorRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, with JSON error answers (see the module doc)."""

    def handle_error(
        self,
        request,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            log.error("error handling request from %s", request.remote, exc_info=exc)
            reason = "internal server error"
        else:  # the client's fault: one line, no traceback
            detail = " ".join(str(message or exc or "unreadable").split())[:300]
            reason = f"malformed HTTP request: {detail}"
            log.info("malformed HTTP request from %s: %s", request.remote, detail)
        if request.writer.output_size > 0:  # a response already started: nothing to add
            raise ConnectionError("response already sent, cannot send an error after it")
        response = json_error(status, reason)
        response.force_close()
        return response


def json_error(status: int, reason: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": reason}, status=status, headers=headers)


def _outermost(handle: Callable) -> Callable:
    """Wrap the app's entry point (routing, `Expect`, then the middlewares)."""

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        expect = request.headers.get(hdrs.EXPECT)
        if expect is not None and expect.lower() != "100-continue":
            return json_error(417, "the only Expect this server knows is 100-continue")
        try:
            return await handle(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
            return json_error(exc.status, exc.reason, allow)

    return handler


class _JsonErrorServer(web.Server):
    def __call__(self) -> RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class FacecastRunner(web.AppRunner):
    """`web.AppRunner` whose connections use `JsonErrorRequestHandler`."""

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        return _JsonErrorServer(
            _outermost(server.request_handler),
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            **server._kwargs,
        )


def run_app(
    app: web.Application, host: str, port: int, print: Callable[[str], None] | None = None
) -> None:
    """Serve `app` until SIGINT/SIGTERM, then shut down gracefully (on_shutdown runs)."""
    loop = asyncio.new_event_loop()
    main = loop.create_task(_serve(app, host, port, print))
    try:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):  # what the runner's signal handlers raise
        pass
    finally:
        if not main.done():
            main.cancel()  # its `finally` runs the runner's cleanup
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(main)
        rest = asyncio.all_tasks(loop)
        for task in rest:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
        asyncio.set_event_loop(None)
        loop.close()


async def _serve(
    app: web.Application, host: str, port: int, print: Callable[[str], None] | None
) -> None:
    runner = FacecastRunner(app, handle_signals=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        if print is not None:
            print(f"======== Running on http://{host}:{port} ========")
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
