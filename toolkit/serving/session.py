"""``ServingSession``: one box's serving stack over one SSH session, as bench, eval and profile use it.

It owns what those commands each used to set up for themselves: the box's addresses (router,
decode and prefill ports from the inventory, ``Addresses``), where the box-side steps read the API
key on the box (``api_env``: the key file's path), readiness (every serving port healthy),
``/server_info``, the served name clients give the model, and the restarts (another context
length, an A/B arm), each after pinning what the units run now. It is a ``Remote``: ``setup`` copies the box-side
package, ``cleanup`` removes the scratch directory; ``with ServingSession(...)`` does both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from dsv4kit.core import box_paths, exitcodes
from dsv4kit.serving.abort import ServingAbort
from dsv4kit.serving.remote import Remote


def key_file(host) -> str:
    """Where the router's API key lies on the box (the file exists only when the inventory sets one):
    the inventory's ``sglang_service_router_secret_file`` when it names a path, else the role's default."""
    named = str(host.get("sglang_service_router_secret_file") or "")
    if named and "{{" not in named:
        return named
    return box_paths.on_box(host, box_paths.ROUTER_KEY_FILE)


def api_env(host) -> dict:
    """The environment of the box-side steps: the path of the box's key file, never the key. Each
    box-side process that sends requests reads the key there itself (``dsv4box.key``)."""
    from dsv4kit.serving.box.key import KEY_FILE_VARIABLE

    return {KEY_FILE_VARIABLE: key_file(host)}


def context_length_of(server_info: dict) -> Optional[int]:
    """The context length a server reports in ``/server_info`` (None if it says none)."""
    from dsv4kit.records.record import decode_info

    value = decode_info(server_info).get("context_length")
    return int(value) if isinstance(value, (int, float)) else None


@dataclass(frozen=True)
class Addresses:
    """Where the serving stack listens on the box (loopback): the router clients reach (the decode
    server itself without a router), the decode server and, in PD mode, the prefill server."""

    router_port: int
    decode_port: int
    prefill_port: Optional[int] = None  # None: no prefill server of its own

    @classmethod
    def of(cls, host) -> "Addresses":
        decode = int(host["dsv4_decode_port"])
        prefill = host.get("dsv4_prefill_port")
        return cls(router_port=int(host.get("dsv4_router_port") or decode), decode_port=decode,
                   prefill_port=int(prefill) if prefill and int(prefill) != decode else None)

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.router_port}"

    @property
    def serving_ports(self) -> list[int]:
        """Every port that must answer ``/health`` before the stack is ready."""
        return sorted({p for p in (self.router_port, self.prefill_port, self.decode_port) if p})

    @property
    def server_ports(self) -> list[int]:
        """The SGLang servers' own ports (decode first): their ``/metrics`` and ``/server_info``."""
        return [self.decode_port] + ([self.prefill_port] if self.prefill_port else [])


class ServingSession(Remote):
    """The serving stack of ``host`` over ``session`` (``dsv4kit.core.ssh``)."""

    def __init__(self, session, host, progress: Callable[[str], None], inventory_path=None):
        super().__init__(session, host, progress)
        self.addresses = Addresses.of(host)
        self.inventory_path = inventory_path
        self.env = api_env(host)

    def __enter__(self) -> "ServingSession":
        self.setup()
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    def served_name(self) -> str:
        """The name clients give the model (``dsv4_served_model_name``, else its repository id, else
        the path SGLang serves it under)."""
        from dsv4kit.serving.served_model import served_name

        return served_name(self.host)

    def wait_ready(self, timeout: float) -> None:
        """Every serving port answers ``/health``; ServingAbort(TIMEOUT) after ``timeout`` seconds."""
        self.wait_health(self.addresses.serving_ports, timeout, self.env)

    def decode_info(self) -> dict:
        """The decode server's ``/server_info``; ServingAbort(ENVIRONMENT) when it does not answer."""
        return self.server_info(self.addresses.decode_port, self.env)

    def prefill_info(self) -> tuple[Optional[dict], Optional[str]]:
        """(the prefill server's ``/server_info``, None) or (None, why it is not there)."""
        if not self.addresses.prefill_port:
            return None, None
        answer = self.helper("server-info", "--port", str(self.addresses.prefill_port), env=self.env)
        return (answer.get("server_info"), None) if answer.get("ok") else (None, str(answer.get("error")))

    def context_length(self) -> Optional[int]:
        return context_length_of(self.decode_info())

    def pin(self, served: Optional[int], *, keep: Optional[str] = None) -> None:
        """Before a restart: every ``auto`` the playbook cannot resolve, pinned to what runs now
        (``dsv4kit.serving.pins``); the probe is read only when there is one."""
        from dsv4kit.serving.pins import has_auto, pin_running

        if has_auto(self.host, keep=keep):
            pin_running(self.host, self.probe(), served or 0, keep=keep)

    def ensure_context(self, ctx: int, timeout: float, *, allow_restart: bool = True,
                       restart: Optional[Callable] = None) -> bool:
        """The decode server runs with context length ``ctx``: restart the serving units with it
        (``restart``, default the playbook's ``default_restart``) when it does not, then wait
        for readiness. True: restarted. ServingAbort(ENVIRONMENT) when a restart is not allowed
        or did not take."""
        from dsv4kit.serving.remote import default_restart

        current = self.context_length()
        if current == ctx:
            return False
        name = self.host.name
        if not allow_restart:
            raise ServingAbort(exitcodes.ENVIRONMENT, f"{name}: the decode server runs with context length "
                                                      f"{current}, not {ctx}, and --no-restart was given")
        self.progress(f"decode server context length is {current}; restarting the serving units with {ctx}...")
        self.pin(current)  # the playbook cannot resolve 'auto'
        (restart or default_restart)(self.inventory_path, self.host, ctx, self.progress, timeout)
        self.wait_ready(timeout)
        after = self.context_length()
        if after != ctx:
            raise ServingAbort(exitcodes.ENVIRONMENT, f"{name}: after the restart the decode server still reports "
                                                      f"context length {after}, not {ctx}")
        return True

    def apply_arm(self, ab, arm: str, context_length: int, timeout: float, apply: Optional[Callable] = None) -> None:
        """Restart the serving units as A/B arm ``arm`` wants (``apply``, default the playbook's
        ``dsv4kit.serving.arms.default_apply_arm``), then wait for readiness."""
        from dsv4kit.serving import arms

        (apply or arms.default_apply_arm)(self.inventory_path, self.host, context_length, ab, arm, self.progress,
                                          timeout)
        self.wait_ready(timeout)
