"""The web portal for account holders and the interactive API docs, served by the gateway itself.

One page at `/` (a Tornado template; the views are drawn by static/portal.js and its modules in static/js/ from
the JSON API), the cookie variants of register and login, logout, and /docs: Swagger UI from the swagger-ui-py
package, served from this process. Nothing is loaded from anywhere else, and no page runs an inline script.

Browser sessions: the session token lives in an HttpOnly, SameSite=Strict cookie (Secure and
__Host- in production) that page scripts cannot read; BaseHandler.bearer_token reads it when no
Authorization header is sent, and BaseHandler.check_xsrf_cookie asks cookie-authenticated writes for
the XSRF token the page carries in a meta tag.
"""

import importlib.util
import os
from typing import Any

import tornado.web

from handlers.auth import handlers as auth
from handlers.base import Anonymous, BaseHandler
from handlers.context import HandlerContext

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "templates")
STATIC = os.path.join(HERE, "static")
# swagger-ui-py ships the Swagger UI distribution; only its files are used, not its own handlers
# (they render an inline script, which the page policy forbids).
SWAGGER = os.path.join(importlib.util.find_spec("swagger_ui").submodule_search_locations[0], "static")
SWAGGER_FILES = ("swagger-ui-bundle.js", "swagger-ui.css")

# Every page: scripts, styles, images and requests from this origin only; no inline script, no framing.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)

# The page's parts its script shows only when named in body[data-features] (portal/static/js/dom.js): every
# process serves these; "sandbox" (the development checkout) is added outside production.
FEATURES = ("password", "key-edit", "key-roll", "usage-summary", "usage-export")


def app_settings(ctx: HandlerContext) -> dict:
    """Application settings for templates and XSRF cookies. No static_path: Tornado would put its static routes
    before every other, data plane included; the portal's own route comes last and PageHandler.static_url
    versions its URLs."""
    production = ctx.state.settings.production
    return {
        "template_path": TEMPLATES,
        "xsrf_cookies": True,
        # The page reads the token from its meta tag, so the cookie itself can be HttpOnly too.
        "xsrf_cookie_name": "__Host-gw_xsrf" if production else "gw_xsrf",
        "xsrf_cookie_kwargs": {"httponly": True, "samesite": "Strict", "secure": production},
    }


class StaticHandler(Anonymous, tornado.web.StaticFileHandler):
    """The portal's files, with nosniff and the JSON error shape."""

    def initialize(self, path: str = STATIC, **kwargs: Any) -> None:
        super().initialize(path=path)  # the context make_app passes every handler is not needed here

    def set_default_headers(self) -> None:
        self.set_header("X-Content-Type-Options", "nosniff")

    def set_extra_headers(self, path: str) -> None:
        # A URL with its content hash (?v=) is cached for a year. The modules portal.js imports are named without
        # one (an import cannot carry it): the browser asks again each time (a 304 while unchanged), so a page
        # never runs a new portal.js with an old module.
        if not self.get_query_argument("v", None):
            self.set_header("Cache-Control", "no-cache")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish({"detail": "Not found" if status_code == 404 else self._reason})


class SwaggerAssetHandler(StaticHandler):
    """The two Swagger UI files /docs needs, from the installed swagger-ui-py package."""

    def initialize(self, **kwargs: Any) -> None:
        super().initialize(SWAGGER)

    @classmethod
    def url(cls, name: str) -> str:
        return f"/docs/assets/{name}?v={cls.get_version({'static_path': SWAGGER}, name)}"


class PageHandler(BaseHandler):
    """HTML pages: the strict policy, no referrer, not cached."""

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Content-Security-Policy", PAGE_POLICY)
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("X-Frame-Options", "DENY")

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        self.set_header("Content-Type", "application/json")
        super().write_error(status_code, **kwargs)

    def static_url(self, path: str, include_host: bool | None = None, **kwargs: Any) -> str:
        """/static/<path>?v=<content hash>: cached for a year, replaced when the file changes."""
        return StaticHandler.make_static_url({"static_path": STATIC}, path, **kwargs)


class PortalHandler(PageHandler):
    """The portal page; the signed-in view when the session cookie holds a valid token."""

    def get(self) -> None:
        signed_in = self.session is not None  # checked by BaseHandler.prepare: logged-out tokens count as out
        features = list(FEATURES)
        sandbox = not self.config.production and self.services.payments.chain is not None
        if sandbox:
            features.append("sandbox")
        self.render(
            "portal.html",
            signed_in=signed_in,
            features=" ".join(features),
            stream_min_interval=f"{self.config.stream_min_interval:g}",  # checked before a rule is sent
        )


class DocsHandler(PageHandler):
    """Interactive API docs (Swagger UI, served offline); "try it out" calls this gateway."""

    def get(self) -> None:
        self.render("docs.html", asset=SwaggerAssetHandler.url)


class LogoutHandler(BaseHandler):
    """Ends the browser session: its token stops working and the cookie is cleared; needs the XSRF token."""

    xsrf_always = True

    async def post(self) -> None:
        s = self.config
        if self.session is not None:
            await self.services.sessions.end(self.session)
            await self.audit("logout")
        self.clear_cookie(self.session_cookie(), httponly=True, secure=s.production, samesite="Strict")
        self.send_json({"ok": True})


routes = [
    (r"/", PortalHandler),
    (r"/portal/register", auth.RegisterHandler, {"cookie": True}),
    (r"/portal/login", auth.LoginHandler, {"cookie": True}),
    (r"/portal/password", auth.PasswordHandler, {"cookie": True}),
    (r"/portal/logout", LogoutHandler),
    (r"/static/(.+)", StaticHandler),
    (r"/docs", DocsHandler),
    (r"/docs/assets/(%s)" % "|".join(f.replace(".", r"\.") for f in SWAGGER_FILES), SwaggerAssetHandler),
]
