"""Hypothesis on CI machines: no per-example deadline and no too-slow health check (2 busy cores)."""
from hypothesis import HealthCheck, settings

settings.register_profile("cosched", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("cosched")
