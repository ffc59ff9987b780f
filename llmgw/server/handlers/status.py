"""An object's status: PUT /{kind}/{name}/status (the whole status) and PATCH (a JSON merge patch)."""
from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from pydantic import ValidationError

from llmgw.api import KINDS, AnyObject, node_of
from llmgw.api.errors import Invalid
from llmgw.api.manifests import describe_validation_error
from llmgw.server.authz import Action, written_fields
from llmgw.server.request import Authorize, dump, json_response, kind_of, read_body, read_object
from llmgw.store import Store


class StatusWrites:
    def __init__(self, store: Store, authorize: Authorize) -> None:
        self.store, self.authorize = store, authorize

    async def _existing(self, request: web.Request, kind: str, name: str,
                        fields: Callable[[AnyObject], frozenset[str]]) -> AnyObject:
        """The object whose status is written, once the write is allowed; `fields(current)`: what it sets."""
        hint = request.query.get("node") or None
        current = await self.store.get(KINDS[kind], name, node=hint)
        await self.authorize(request, Action("status", kind, name, node=hint, obj_node=node_of(current),
                                             fields=fields(current), labels=current.metadata.labels))
        return current

    async def update(self, request: web.Request) -> web.Response:
        kind = kind_of(request)
        obj = await read_object(request, kind, require="status")
        current = await self._existing(
            request, kind, obj.name, lambda cur: written_fields(cur.model_copy(update={"status": obj.status}), cur))
        new = current.model_copy(update={"status": obj.status})
        return json_response(dump(await self.store.update_status(new)))

    async def patch(self, request: web.Request) -> web.Response:
        kind, name = kind_of(request), request.match_info["name"]
        patch = await read_body(request)
        status_type = KINDS[kind].model_fields["status"].annotation
        assert status_type is not None  # every kind declares its status
        try:  # every status field has a default, so the patch alone says whether its fields are well typed
            status_type.model_validate(patch)
        except ValidationError as err:
            raise Invalid("; ".join(f"status.{line}" for line in describe_validation_error(err))) from None
        current = await self._existing(request, kind, name, lambda cur: frozenset(f"status.{k}" for k in patch))
        return json_response(dump(await self.store.patch_status(KINDS[kind], name, patch, current=current)))
