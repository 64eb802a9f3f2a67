"""Request bodies the API refuses before any view sees them, and error answers kept short.

A JSON body nested deeper than ``MAX_JSON_DEPTH`` is a 400 (Python's parser would raise
RecursionError, a 500, past about a thousand levels, and every recursive step after it, the YAML
dump of overrides included, would risk the same). Error messages that quote input are capped.
"""

from __future__ import annotations

from django.db import DatabaseError
from rest_framework.exceptions import ErrorDetail, ParseError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import exception_handler

from webapp.registry.table_reader import nesting_exceeds
from webapp.policy.limits import capped

# Overrides nest five levels deep, metrics three; nothing the API reads needs more.
MAX_JSON_DEPTH = 32


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - the body nests deeper than {MAX_JSON_DEPTH} levels.") from None
        if nesting_exceeds(data, MAX_JSON_DEPTH):
            raise ParseError(f"JSON parse error - the body nests deeper than {MAX_JSON_DEPTH} levels.")
        return data


def capped_exception_handler(exc, context):
    """DRF's handler, with every message in the answer cut to ``limits.MAX_ERROR_CHARS``; a
    database that does not answer is a clear 503 (nothing was recorded), never a 500."""
    if isinstance(exc, DatabaseError):
        return Response({"detail": "The database is unavailable, so nothing was recorded; try again shortly."},
                        status=503, headers={"Retry-After": "10"})
    response = exception_handler(exc, context)
    if response is not None:
        response.data = _cap(response.data)
    return response


def _cap(data):
    if isinstance(data, dict):
        return {key: _cap(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_cap(value) for value in data]
    if isinstance(data, ErrorDetail):
        return ErrorDetail(capped(data), code=data.code)
    return capped(data) if isinstance(data, str) else data
