"""API tokens that expire and end at logout (the token endpoint is ``webapp.api.token_view``).

DRF's own ``Token`` (one per user, ``Authorization: Token <key>``) is kept, so the CLI, the SDK
sink and ``manage.py drf_create_token`` work as before; a token older than
``settings.API_TOKEN_TTL_SECONDS`` is refused and deleted, ``POST /api/token/`` hands out a new
one in its place, and logging out of the site deletes the user's token. Wrong passwords on
``/api/token/`` count towards the same django-axes lockout as the login page.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone
from rest_framework.authentication import TokenAuthentication
from rest_framework.authtoken.models import Token
from rest_framework.exceptions import AuthenticationFailed


def token_expired(token: Token) -> bool:
    return token.created < timezone.now() - timedelta(seconds=settings.API_TOKEN_TTL_SECONDS)


class ExpiringTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key):
        user, token = super().authenticate_credentials(key)
        if token_expired(token):
            token.delete()
            raise AuthenticationFailed("Token expired; get a new one: POST your username and password to /api/token/.")
        return user, token


def end_tokens_at_logout(sender, request, user, **kwargs) -> None:
    """Logging out of the site ends the user's API token too (a stolen one stops working)."""
    if user is not None:
        Token.objects.filter(user=user).delete()
