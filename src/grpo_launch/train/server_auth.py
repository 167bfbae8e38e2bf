"""TRL's clients of the run's vLLM server carry the attempt's token (the server's guard,
:mod:`grpo_launch.node.vllm_guard`, refuses every route but /health without it).

TRL 1.16 has no option for a header, and its clients build their HTTP sessions themselves:

* the sync ``VLLMClient`` (trl/generation/vllm_client.py) makes its ``requests.Session`` in ``__init__`` and calls
  ``/v1/models`` there, before a header could be set on it after construction;
* the async ``VLLMClient`` (trl/experimental/async_grpo/vllm_client.py) calls ``requests.get``/``requests.post``,
  a new Session per request;
* the async rollout worker (trl/experimental/async_grpo/async_rollout_worker.py, ``_AsyncRolloutLoop._run_loops``)
  opens an ``aiohttp.ClientSession`` in a spawned child process.

So :func:`guard_clients` wraps ``requests.Session.request`` to add ``Authorization: Bearer <token>`` to requests for
the server's origin only (scheme, host and port of vllm_server_base_url: the token goes to no other host, the Hub
included), which covers both ``VLLMClient``\\ s; and, for an async run, has the rollout worker start
:class:`grpo_launch.train.async_auth.GuardedRolloutLoop`, which sets the header on its aiohttp session (the child
reads the token from the environment it inherits). What carries no token: TRL's NCCL weight-sync group (a
torch.distributed store on vllm_group_port, not HTTP): the guard cannot cover it; the server reaches it at the trainer
rank 0's address only after an authorized ``/init_weight_transfer_engine``.

Importing this module is cheap: requests and trl are imported by :func:`guard_clients`.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of ``url``, the port filled in from the scheme."""
    parts = urlsplit(url)
    scheme = (parts.scheme or "http").lower()
    return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme, 80)


def guard_clients(base_url: str | None, token: str | None, *, asynchronous: bool = False) -> None:
    """TRL's requests to ``base_url`` carry ``token`` from now on in this process (and, ``asynchronous``, in the
    rollout worker's child). Nothing without a server or a token (a run not started by grpo-launch)."""
    if not base_url or not token:
        return
    import requests

    server = origin(base_url)
    unwrapped: Any = getattr(requests.Session.request, "__wrapped__", requests.Session.request)

    def request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if not args and origin(str(url)) == server:  # headers given by keyword (every TRL call and requests.api)
            kwargs["headers"] = {"Authorization": f"Bearer {token}", **(kwargs.get("headers") or {})}
        return unwrapped(self, method, url, *args, **kwargs)

    request.__wrapped__ = unwrapped  # type: ignore[attr-defined]  # a second call replaces, never stacks
    requests.Session.request = request  # type: ignore[method-assign,assignment]
    if asynchronous:
        from grpo_launch.train.async_auth import use_guarded_loop

        use_guarded_loop()
