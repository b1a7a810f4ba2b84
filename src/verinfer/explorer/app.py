"""The explorer's web app: server-rendered pages over ``views``, the same data as JSON under
``/api/``, vendored static files, a strict Content-Security-Policy.

Every page works with JavaScript off; ``static/live.js`` (the only script) polls
``/api/status`` and, when the index moved, swaps the page's ``<main>`` for a fresh render —
so a challenge page walks through its phases without a reload.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from verinfer.errors import InvalidRequestError, VerinferError
from verinfer.explorer import views
from verinfer.explorer.errors import http_status
from verinfer.explorer.ids import parse_int_id
from verinfer.explorer.views import Context

log = logging.getLogger("verinfer.explorer")
HERE = Path(__file__).parent
#: Nothing but this origin: no inline script or style, no frames, no form posts elsewhere.
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}


_ROLE_TITLES = {"operator": "Operator", "verifier": "Verifier"}


def short(value: object, head: int = 10, tail: int = 6) -> str:
    s = str(value)
    return s if len(s) <= head + tail + 1 else f"{s[:head]}…{s[-tail:]}"


def create_app(ctx: Context) -> FastAPI:
    app = FastAPI(title="verinfer explorer", docs_url=None, redoc_url=None, openapi_url=None)
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters["short"] = short
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")

    @app.middleware("http")
    async def headers(request: Request,
                      call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        resp = await call_next(request)
        for k, v in SECURITY_HEADERS.items():
            resp.headers.setdefault(k, v)
        if not request.url.path.startswith("/static/"):
            resp.headers.setdefault("Cache-Control", "no-store")
        return resp

    def render(request: Request, template: str, data: dict[str, Any], title: str,
               status_code: int = 200) -> HTMLResponse:
        return templates.TemplateResponse(request, template, {"d": data, "title": title},
                                          status_code=status_code)

    def error_page(request: Request, status_code: int, message: str) -> Response:
        if request.url.path.startswith("/api/"):
            return JSONResponse({"error": {"message": message, "status": status_code}},
                                status_code=status_code)
        label = {404: "Not found", 400: "Bad request"}.get(status_code, "Error")
        return render(request, "error.html", {"status_code": status_code, "label": label,
                                              "message": message,
                                              "status": views.status(ctx)},
                      f"{status_code} {label}", status_code)

    @app.exception_handler(VerinferError)
    async def verinfer_error(request: Request, e: VerinferError) -> Response:
        return error_page(request, http_status(e), e.message)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> Response:
        msg = "no such page" if e.status_code == 404 else str(e.detail)
        return error_page(request, e.status_code, msg)

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> Response:
        log.exception("explorer: %s %s", request.method, request.url.path)
        return error_page(request, 500, "internal error (logged on the server)")

    # ---- pages and their JSON twins ------------------------------------------------------------
    # Plain `def` handlers: FastAPI runs them in its thread pool, so a page that waits on a slow
    # DA backend or index read blocks one worker thread, not the event loop serving every page.
    def page(path: str, template: str, title: Callable[[dict[str, Any]], str],
             build: Callable[..., dict[str, Any]], *, paged: bool = False,
             filters: tuple[str, ...] = ()) -> None:
        def html(request: Request) -> Response:
            data = build(ctx, **_args(request, paged, filters))
            return render(request, template, data, title(data))

        def api(request: Request) -> Response:
            return JSONResponse(build(ctx, **_args(request, paged, filters)))

        app.add_api_route(path, html, methods=["GET"], response_class=HTMLResponse)
        app.add_api_route("/api" + (path if path != "/" else "/overview"), api, methods=["GET"])

    page("/", "overview.html", lambda d: "Overview", views.overview)
    page("/operator/{address}", "operator.html",
         lambda d: f"{_ROLE_TITLES.get(d['account']['role'], 'Account')} "
                   f"{d['account']['address']}",
         views.operator)
    page("/batch/{batch_id}", "batch.html", lambda d: f"Batch {short(d['batch']['batch_id'])}",
         views.batch, paged=True)
    page("/receipt/{receipt_id}", "receipt.html", lambda d: f"Receipt {short(d['receipt_id'])}",
         views.receipt)
    page("/challenge/{challenge_id}", "challenge.html",
         lambda d: f"Challenge {d['challenge']['id']}", views.challenge)
    page("/claim/{claim_id}", "claim.html", lambda d: f"Claim {d['claim']['id']}", views.claim)
    page("/challenges", "challenges.html", lambda d: "Challenges", views.challenges_list,
         paged=True)
    page("/batches", "batches.html", lambda d: "Batches", views.batches_list, paged=True)
    page("/receipts", "receipts.html", lambda d: "Receipts", views.receipts_list, paged=True,
         filters=("operator", "model", "status"))
    page("/operators", "operators.html", lambda d: "Operators", views.operators_list,
         paged=True, filters=("operator", "model", "status"))
    page("/models", "models.html", lambda d: "Models", views.models_list, paged=True,
         filters=("q", "operator", "status"))
    page("/audits", "audits.html", lambda d: "Light audits", views.audits)
    page("/kms", "kms.html", lambda d: "KMS", views.kms)

    @app.get("/api/status")
    def api_status() -> JSONResponse:
        return JSONResponse(views.status(ctx))

    @app.get("/api/search")
    def api_search(q: str = "") -> JSONResponse:
        return JSONResponse(views.search(ctx, q))

    @app.get("/search")
    def search(q: str = "") -> Response:
        hit = views.search(ctx, q)
        return RedirectResponse(hit["url"], status_code=303)

    @app.get("/favicon.ico")
    async def favicon() -> Response:
        return Response(status_code=204)

    return app


#: Longest query string a page reads (the filters are far shorter; lists.MAX_FILTER each).
MAX_QUERY_STRING = 2048


def _args(request: Request, paged: bool, filters: tuple[str, ...] = ()) -> dict[str, Any]:
    """Path parameters as given (the views parse them strictly), on paged lists ``?page=N``
    and the page's ``filters`` (each given once; the views bound and parse them)."""
    if len(request.url.query) > MAX_QUERY_STRING:
        raise InvalidRequestError(f"query string of {len(request.url.query)} characters: at "
                                  f"most {MAX_QUERY_STRING}", param="query")
    args: dict[str, Any] = dict(request.path_params)
    raw = request.query_params.get("page")
    if paged and raw is not None:
        args["page"] = parse_int_id(raw, "page") if raw else 1
    for name in filters:
        values = request.query_params.getlist(name)
        if len(values) > 1:
            raise InvalidRequestError(f"{name} given {len(values)} times: once at most",
                                      param=name)
        if values:
            args[name] = values[0]
    return args
