"""``POST /api/token/``: a token for a username and password, behind the login lockout
(django-axes counts wrong passwords here and on the login page alike); a new token replaces an
expired one (``webapp.api.auth``)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from rest_framework import serializers
from rest_framework.authtoken.models import Token
from rest_framework.authtoken.serializers import AuthTokenSerializer
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.exceptions import Throttled
from rest_framework.response import Response
from rest_framework.views import APIView

from webapp.api.auth import token_expired


class LockedOut(Throttled):
    default_detail = "Too many failed logins for this account from this address; try again later."


class TokenRequestSerializer(AuthTokenSerializer):
    # Django's username length: the lockout stores what is tried, so nothing longer gets that far.
    username = serializers.CharField(max_length=150, write_only=True)
    password = serializers.CharField(max_length=4096, write_only=True, trim_whitespace=False,
                                     style={"input_type": "password"})

    def validate(self, attrs):
        from axes.handlers.proxy import AxesProxyHandler

        request = self.context["request"]
        if AxesProxyHandler.is_locked(request._request, credentials={"username": attrs["username"]}):
            raise LockedOut(wait=settings.AXES_COOLOFF_TIME.total_seconds())
        try:
            return super().validate(attrs)
        except serializers.ValidationError:
            if getattr(request, "axes_locked_out", False):  # this failure reached the limit
                raise LockedOut(wait=settings.AXES_COOLOFF_TIME.total_seconds()) from None
            raise


class ObtainExpiringToken(ObtainAuthToken):
    """``POST username, password`` -> ``{"token": key, "expires": iso time}``; a new token replaces an expired one."""

    parser_classes = APIView.parser_classes  # the API's own (bounded JSON) parsers
    serializer_class = TokenRequestSerializer

    def post(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        user = serializer.validated_data["user"]
        token, _ = Token.objects.get_or_create(user=user)
        if token_expired(token):
            token.delete()
            token = Token.objects.create(user=user)
        expires = token.created + timedelta(seconds=settings.API_TOKEN_TTL_SECONDS)
        return Response({"token": token.key, "expires": expires.isoformat()})
