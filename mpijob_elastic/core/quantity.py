"""Kubernetes resource quantities, added and written as the API machinery's Go code does.

A PodGroup's ``minResources`` is the sum of the pods' requests; training-operator 1.9
adds them as ``resource.Quantity`` values, whose JSON form is canonical (``1500m``,
``2Gi``, ``1k``), so the same sum written any other way would be a different PodGroup.
The rules below are those of k8s.io/apimachinery's ``Quantity.Add`` and
``CanonicalizeBytes``: a sum keeps the format of its first non-zero term; a decimal value
is written with the largest exponent that is a multiple of 3 and leaves a whole mantissa;
a binary one (``Ki``, ``Mi``...) in powers of 1024 when it is whole and at least 1024,
else as a decimal one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from mpijob_elastic.core import numbers

DECIMAL_SI = "DecimalSI"
BINARY_SI = "BinarySI"
DECIMAL_EXPONENT = "DecimalExponent"

_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_DECIMAL_SUFFIX = {exp: suffix for suffix, exp in _DECIMAL.items()}
_BINARY_SUFFIX = {exp: suffix for suffix, exp in _BINARY.items()}
_FORM = re.compile(
    r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[KMGTPE]i|[numkMGTPE]?)"
)
# A quantity is read only this long and this far from 1: the spec and the objects others
# write hold any text, and Decimal raises on an exponent past its context's (1e999999), a
# sum of huge values overflows, and int() and str() of one beyond 4300 digits raise. No
# resource is counted in a number of more than 64 characters, or scaled past 1e999.
_MAX_NUMBER = 64
_MAX_EXPONENT = 999


@dataclass(frozen=True)
class Quantity:
    value: Decimal
    format: str

    def __add__(self, other: Quantity) -> Quantity:
        # Quantity.Add: the receiver's format, unless the receiver is zero.
        fmt = other.format if self.value == 0 else self.format
        return Quantity(self.value + other.value, fmt)

    def __str__(self) -> str:
        return _canonical(self.value, self.format)


def parse(text: object) -> Quantity | None:
    """A quantity as the API server reads one (a number or a string); None if it is none."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        return None
    found = _FORM.fullmatch(str(text))
    if found is None:
        return None
    number, suffix = found.groups()
    if len(number) > _MAX_NUMBER:
        return None
    try:
        value = Decimal(number)
    except InvalidOperation:
        return None
    if suffix in _BINARY:
        return Quantity(value * (2 ** _BINARY[suffix]), BINARY_SI)
    if suffix[:1] in ("e", "E"):
        exponent = numbers.whole(suffix[1:].lstrip("+-"), _MAX_EXPONENT)
        if exponent is None:
            return None
        return Quantity(value.scaleb(-exponent if suffix[1] == "-" else exponent), DECIMAL_EXPONENT)
    # Values below a nano are rounded up to one (ParseQuantity).
    scaled = value.scaleb(_DECIMAL[suffix])
    nanos = scaled.scaleb(9)
    if nanos != nanos.to_integral_value():
        scaled = nanos.to_integral_value(rounding="ROUND_CEILING").scaleb(-9)
    return Quantity(scaled, DECIMAL_SI)


def _remove_factors(value: int, base: int) -> tuple[int, int]:
    times = 0
    while value != 0 and value % base == 0:
        value //= base
        times += 1
    return value, times


def _canonical(value: Decimal, fmt: str) -> str:
    if value == 0:
        return "0"
    if fmt == BINARY_SI and (-1024 < value < 1024 or value != value.to_integral_value()):
        fmt = DECIMAL_SI
    if fmt == BINARY_SI:
        mantissa, times = _remove_factors(int(value), 1024)
        if times * 10 in _BINARY_SUFFIX or times == 0:
            return f"{mantissa}{_BINARY_SUFFIX.get(times * 10, '')}"
        # Beyond Ei: more than the suffixes name, as Go writes it in decimal.
        fmt = DECIMAL_SI
    sign, digits, exponent = value.normalize().as_tuple()
    mantissa = int("".join(map(str, digits))) * (-1 if sign else 1)
    exp = int(exponent)
    # A whole mantissa with the exponent lowered to a multiple of 3.
    mantissa *= 10 ** (exp % 3)
    exp -= exp % 3
    if fmt == DECIMAL_SI and exp in _DECIMAL_SUFFIX:
        return f"{mantissa}{_DECIMAL_SUFFIX[exp]}"
    return f"{mantissa}e{exp}" if exp else str(mantissa)
