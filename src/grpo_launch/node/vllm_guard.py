"""The guard in front of a run's vLLM server: an ASGI middleware, installed with vLLM's own ``--middleware
grpo_launch.node.vllm_guard.VllmGuard`` (render/processes.py). It runs inside the server's process, so it uses the
standard library only.

Why: TRL's weight sync needs ``VLLM_SERVER_DEV_MODE=1``, which opens ``/collective_rpc`` (any worker method by name),
``/init_weight_transfer_engine`` + ``/update_weights`` (someone else's weights), ``/pause``, ``/sleep``,
``/abort_requests``, ``/server_info`` and free inference to whoever reaches the port. vLLM's ``--api-key`` guards
only ``/v1``, ``/v2``, ``/inference`` and ``/cohere`` (vllm/entrypoints/serve/middleware/authenticate.py), and
TRL's clients send no key.

How vLLM applies it (vLLM 0.31, vllm/entrypoints/serve/middleware/register.py, ``init_entrypoints_middleware``):
each ``--middleware`` import path that names a class is added with ``app.add_middleware(cls)``, after every router
(dev routes included) is registered (vllm/entrypoints/launchers/app.py, ``build_app``). Starlette's middleware wraps
the whole app, router and mounts alike, and is built on the first request, so it sees every route (tests/
test_vllm_guard_server.py proves it against the real server). It is constructed with the app alone, so the token
comes from the environment (:data:`~grpo_launch.rundir.layout.VLLM_TOKEN_ENV`), which the launcher fills per
attempt (locally the process environment, on ssh/Ray hosts stdin like HF_TOKEN): never argv, never a file. A
server started without it refuses to start (fail closed).

Every request but ``GET /health`` and ``GET /metrics`` needs ``Authorization: Bearer <token>`` (compared with
hmac.compare_digest, in constant time): 401 without it or with a wrong one. With it, only the endpoints TRL 1.16's
clients call pass (:data:`ALLOWED`); anything else is 403. TRL's callers, by endpoint:

==================================  ==========================================================================
``GET /health`` (no token)          trl/generation/vllm_client.py ``VLLMClient.check_server`` (plain requests.get);
                                    trl/experimental/async_grpo/vllm_client.py ``VLLMClient.wait_for_server_ready``
``GET /v1/models``                  trl/generation/vllm_client.py ``VLLMClient.__init__``; async vllm_client.py
                                    ``get_max_model_len``
``GET /server_info``                trl/generation/vllm_client.py ``get_server_info``; async vllm_client.py
                                    ``get_dtype``, ``get_server_info``
``GET /get_world_size``             trl/generation/vllm_client.py ``get_world_size``; async ``get_world_size``
``POST /v1/completions``            trl/generation/vllm_client.py ``generate``, ``get_sequence_logprobs``;
                                    trl/experimental/async_grpo/async_rollout_worker.py
                                    ``_AsyncRolloutLoop._generate_one_turn`` (through ``_post``, aiohttp)
``POST /v1/chat/completions``       trl/generation/vllm_client.py ``chat``
``POST /v1/chat/completions/render`` trl/generation/vllm_client.py ``image_features``
``POST /inference/v1/generate``     trl/generation/vllm_client.py ``_generate_from_features``
``POST /init_weight_transfer_engine`` trl/generation/vllm_client.py ``init_communicator``; async
                                    ``init_weight_transfer_engine``
``POST /start_weight_update``       trl/generation/vllm_client.py ``_start_weight_update``; async
                                    ``start_weight_update``
``POST /update_weights``            trl/generation/vllm_client.py ``update_named_params``; async ``update_weights``
``POST /finish_weight_update``      trl/generation/vllm_client.py ``_finish_weight_update``; async
                                    ``finish_weight_update``
``POST /reset_prefix_cache``        trl/generation/vllm_client.py ``reset_prefix_cache``
``POST /pause``, ``POST /resume``   async vllm_client.py ``pause``, ``resume`` (weight_transfer.py
                                    ``WeightTransfer.pause``/``resume``)
``POST /v1/load_lora_adapter``,     async vllm_client.py ``load_lora_adapter``, ``unload_lora_adapter`` (the
``POST /v1/unload_lora_adapter``    adapter-only sync of an async LoRA run)
==================================  ==========================================================================

Open without the token (:data:`OPEN`): ``GET /health`` (TRL's and the launcher's readiness probe) and ``GET
/metrics``, vLLM's read-only Prometheus counters (queue, KV-cache use, preemptions, tokens/s; no TRL caller). The
token is drawn per attempt and never written down, so a Prometheus server could not carry it: scraping needs the
endpoint open, as Prometheus endpoints are. It reads counters and the served model's name, changes nothing, and
answers GET alone (``POST /metrics`` is 403 with the token, 401 without). The plan names the address
(``vllm.metrics_urls`` in plan.json) and monitoring/prometheus.yml lists it beside the run's own endpoint.

Refused even with the token: ``/collective_rpc``, ``/sleep``, ``/wake_up``, ``/is_sleeping``, ``/abort_requests``,
``/tokenize``, ``/v1/responses``, the docs, and every other route. WebSocket connections are closed (TRL opens none).

A server the launcher started again after losing the first (:data:`RESTARTED_ENV` set: it loaded its weights from
disk, not the trainers' current ones) refuses generation (:data:`GENERATION`) with 503 until the trainers have
pushed their weights: TRL's ``sync_weights`` ends with ``POST /reset_prefix_cache``, whose success unlocks it. So no
completion is ever sampled from weights the trainers no longer hold (grpo_launch.train.server_restart).
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from grpo_launch.rundir.layout import VLLM_RESTARTED_ENV, VLLM_TOKEN_ENV

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# Without the token: the readiness probe (TRL's and the launcher's), and vLLM's read-only Prometheus counters (a
# scraper cannot hold a token drawn per attempt; see above).
OPEN = frozenset({("GET", "/health"), ("GET", "/metrics")})
RESTARTED_ENV = VLLM_RESTARTED_ENV  # "1": a replacement server, locked until the trainers' weights arrive
GENERATION = frozenset(
    {("POST", "/v1/completions"), ("POST", "/v1/chat/completions"), ("POST", "/inference/v1/generate")}
)
UNLOCK = ("POST", "/reset_prefix_cache")
ALLOWED = frozenset(
    {
        ("GET", "/v1/models"),
        ("GET", "/server_info"),
        ("GET", "/get_world_size"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/chat/completions/render"),
        ("POST", "/inference/v1/generate"),
        ("POST", "/init_weight_transfer_engine"),
        ("POST", "/start_weight_update"),
        ("POST", "/update_weights"),
        ("POST", "/finish_weight_update"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/pause"),
        ("POST", "/resume"),
        ("POST", "/v1/load_lora_adapter"),
        ("POST", "/v1/unload_lora_adapter"),
    }
)


def server_token(environ: MutableMapping[str, str] | None = None) -> str:
    """The attempt's token from the environment; a missing or empty one is an error (the server does not start
    unguarded)."""
    token = (os.environ if environ is None else environ).get(VLLM_TOKEN_ENV, "")
    if not token:
        raise RuntimeError(
            f"grpo_launch.node.vllm_guard: {VLLM_TOKEN_ENV} is not set, so the server would be open to anyone who "
            "reaches its port; grpo-launch sets it for every attempt (set it yourself to run the command by hand)"
        )
    return token


def authorized(headers: list[tuple[bytes, bytes]], token: bytes) -> bool:
    """Whether ``headers`` carry ``Authorization: Bearer <token>``, compared in constant time (a wrong token of
    any length takes as long as any other)."""
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, given = value.partition(b" ")
            return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)
    return False


class VllmGuard:
    """The ASGI middleware: ``VllmGuard(app)`` as Starlette's ``add_middleware`` builds it; ``token`` for tests."""

    def __init__(self, app: App, token: str | None = None, *, restarted: bool | None = None) -> None:
        self.app = app
        self.token = (token or server_token()).encode()
        self.locked = os.environ.get(RESTARTED_ENV) == "1" if restarted is None else restarted

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self.app(scope, receive, send)
            return
        if kind == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        method, path = str(scope.get("method", "")).upper(), str(scope.get("path", ""))
        if (method, path) in OPEN:
            await self.app(scope, receive, send)
            return
        if not authorized(list(scope.get("headers") or []), self.token):
            await _refuse(send, 401, "this vLLM server needs the run's bearer token")
            return
        if (method, path) not in ALLOWED:
            await _refuse(send, 403, f"{method} {path} is not an endpoint TRL's clients use")
            return
        if self.locked and (method, path) in GENERATION:
            await _refuse(send, 503, "this vLLM server was restarted: it generates once the trainers' weights are in")
            return
        if self.locked and (method, path) == UNLOCK:
            await self.app(scope, receive, self._unlocking(send))
            return
        await self.app(scope, receive, send)

    def _unlocking(self, send: Send) -> Send:
        """``send``, unlocking generation once the weights' last step answers 200."""

        async def watched(message: Message) -> None:
            if message.get("type") == "http.response.start" and message.get("status") == 200:
                self.locked = False
            await send(message)

        return watched


async def _refuse(send: Send, status: int, why: str) -> None:
    body = json.dumps({"error": why}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
