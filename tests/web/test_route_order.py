"""The order routes are matched in: the translation APIs first (a request is compared with
each route in turn until one fits), which is safe only while no two routes answer the same
method and path."""

from __future__ import annotations

from fastapi.routing import APIRoute

from service.web.app import ROUTERS


def _routes() -> list[tuple[str, str]]:
    return [
        (method, route.path)
        for module, _tag in ROUTERS
        for route in module.router.routes
        if isinstance(route, APIRoute)
        for method in sorted(route.methods)
    ]


def test_no_two_routes_answer_the_same_method_and_path():
    routes = _routes()
    assert len(routes) == len(set(routes))


def test_the_translation_routes_are_matched_before_the_stored_item_routes():
    routes = _routes()
    translate = [routes.index(("POST", path)) for path in ("/v1/translate", "/translate")]
    stored = [
        i
        for i, (_, path) in enumerate(routes)
        if path.startswith(("/v1/glossaries", "/v1/memories"))
    ]
    assert max(translate) < min(stored)
