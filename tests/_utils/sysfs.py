"""Linux thermal zones on disk, laid out as the kernel lays them out, for the sensor tests."""

from __future__ import annotations

from pathlib import Path


def make_zone(root: Path, index: int, kind: str | None, temp: str | None, trips=()) -> Path:
    """thermal_zoneN with ``type``, ``temp`` and trips ``(type, m°C, hyst m°C)`` as the kernel lays them out."""
    zone = root / f"thermal_zone{index}"
    zone.mkdir(parents=True, exist_ok=True)
    if kind is not None:
        (zone / "type").write_text(kind + "\n")
    if temp is not None:
        (zone / "temp").write_text(temp)
    for n, (trip_type, trip_temp, hyst) in enumerate(trips):
        (zone / f"trip_point_{n}_type").write_text(trip_type + "\n")
        (zone / f"trip_point_{n}_temp").write_text(f"{trip_temp}\n")
        if hyst is not None:
            (zone / f"trip_point_{n}_hyst").write_text(f"{hyst}\n")
    return zone


def make_cpufreq_policy(root: Path, index: int, max_khz: int, min_khz: int, available=()) -> Path:
    """sys/devices/system/cpu/cpufreq/policyN under ``root`` with its limits (kHz) and frequency table."""
    policy = root / "sys" / "devices" / "system" / "cpu" / "cpufreq" / f"policy{index}"
    policy.mkdir(parents=True, exist_ok=True)
    (policy / "scaling_max_freq").write_text(f"{max_khz}\n")
    (policy / "scaling_min_freq").write_text(f"{min_khz}\n")
    (policy / "cpuinfo_max_freq").write_text(f"{max(available or (max_khz,))}\n")
    (policy / "cpuinfo_min_freq").write_text(f"{min(available or (min_khz,))}\n")
    if available:
        (policy / "scaling_available_frequencies").write_text(" ".join(str(f) for f in available) + " \n")
    return policy
