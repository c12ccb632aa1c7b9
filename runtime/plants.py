"""Planted defects, for the seeded simulation only (docs/simulation.md): each name switches off
one guard so the simulation can show it catches the defect. ``settings.SIMULATION_PLANTS`` is
empty everywhere else (nothing sets it but ``manage.py simulate --plant``), so in production
``planted`` is one attribute read that answers False.

- ``stale-accept``: the acceptance skips its fence (lease generation, state version, token).
- ``stop-unlocked``: a stop settles not-running work whose earlier call went unconfirmed as
  ``cancelled``, as a stop decided from an unlocked read (before the call's record) would.
- ``release-expired``: the release gate releases an approval whose validity has ended.
"""

from __future__ import annotations

from django.conf import settings

PLANTS = ("stale-accept", "stop-unlocked", "release-expired")


def planted(name: str) -> bool:
    """Whether the planted defect ``name`` is switched on (simulation runs only)."""
    return name in getattr(settings, "SIMULATION_PLANTS", ())
