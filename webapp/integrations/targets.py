"""Where an alert goes: an email address, or a webhook URL that apprise reads. ``check_target``
turns what a member typed into the stored target (or says why not), ``target_label`` into what a
page may show of it. The models store labels; the alerts send to targets."""

from __future__ import annotations

from urllib.parse import quote

from django.conf import settings
from django.core.validators import validate_email

from training.isolation.egress import EgressRefused, Guard

# apprise schemes a rule may name: webhooks only (no local files, no shell, no SMTP of the user's).
WEBHOOK_SCHEMES = {"json", "jsons", "form", "forms", "slack", "discord"}
# Of those, the ones whose URL names the server posted to (Slack and Discord post to their own).
SERVER_SCHEMES = {"json", "jsons", "form", "forms"}


def egress_guard() -> Guard:
    return Guard(allowed=tuple(settings.EGRESS_ALLOWED_HOSTS))


def plugin_of(target: str):
    """apprise's own reading of a webhook URL (its plugin), or None when apprise cannot use it.
    Its asset sends in the calling thread (not apprise's thread pool), where the egress route is."""
    import apprise

    return apprise.Apprise.instantiate(target, asset=apprise.AppriseAsset(async_mode=False))


def server_url(plugin) -> str:
    """The http(s) origin a json:// or form:// plugin posts to, as apprise reads it."""
    port = f":{plugin.port}" if plugin.port else ""
    return f"{'https' if plugin.secure else 'http'}://{plugin.host}{port}/"


def check_target(target: str) -> str:
    """A rule's target as stored: an email address, or a webhook URL rebuilt from apprise's reading
    of it (json:// and form://: only the user, password, host, port and path). Raises ValueError.

    Options after ``?`` are refused: they choose the HTTP method, extra headers (``+Header=``),
    query and payload keys, timeouts and certificate checks, none of which a member sets. The
    server is the one apprise will post to (its plugin's host and port), judged by the egress guard
    now and again at every delivery."""
    target = target.strip()
    if "://" not in target:
        try:
            validate_email(target.removeprefix("mailto:"))
        except Exception:
            raise ValueError(f"{target!r} is neither an email address nor a webhook URL (json://, slack://, discord://).") from None
        return target.removeprefix("mailto:")
    scheme = target.split("://", 1)[0].lower()
    if scheme not in WEBHOOK_SCHEMES:
        raise ValueError(f"{scheme}:// is not a webhook this platform sends to; use one of {', '.join(sorted(WEBHOOK_SCHEMES))}, or an email address.")
    if "?" in target:
        raise ValueError("Options after '?' are not accepted (they choose the method, headers, timeouts and certificate "
                         "checks, which the platform sets); remove everything from the '?' on.")
    plugin = plugin_of(target)
    if plugin is None:
        raise ValueError(f"apprise cannot use this {scheme}:// URL; check its format.")
    if scheme not in SERVER_SCHEMES:
        return target
    canonical = _canonical(scheme, plugin)
    again = plugin_of(canonical)
    if again is None or (again.host, again.port, again.fullpath, again.user) != (plugin.host, plugin.port, plugin.fullpath, plugin.user):
        raise ValueError(f"this {scheme}:// URL cannot be read one way only; write it as {scheme}://host[:port]/path.")
    try:
        egress_guard().check_url(server_url(plugin), unresolved_ok=True)
    except EgressRefused as exc:
        raise ValueError(f"The webhook's server {plugin.host}: {exc}") from None
    return canonical


def _canonical(scheme: str, plugin) -> str:
    auth = ""
    if plugin.user:
        auth = quote(plugin.user, safe="") + (f":{quote(plugin.password, safe='')}" if plugin.password else "") + "@"
    port = f":{plugin.port}" if plugin.port else ""
    return f"{scheme}://{auth}{plugin.host}{port}{quote(plugin.fullpath or '/', safe='/')}"


def target_label(target: str) -> str:
    """The target without its secret parts (webhook tokens, passwords, paths): shown on pages. A
    server's host is the one apprise posts to."""
    if "://" not in target:
        return target
    scheme = target.split("://", 1)[0].lower()
    plugin = plugin_of(target) if scheme in SERVER_SCHEMES else None
    if plugin is None:
        return f"{scheme}://…"
    return f"{scheme}://{plugin.host}{':%d' % plugin.port if plugin.port else ''}/…"
