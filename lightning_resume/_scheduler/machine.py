"""Which cloud this machine runs on, from the firmware's (DMI) strings: no network (a metadata server
polled off its cloud waits for a time-out)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

#: The DMI strings read, under ``/sys/class/dmi/id/``.
DMI_FIELDS = (
    "sys_vendor",
    "product_name",
    "product_version",
    "bios_vendor",
    "bios_version",
    "chassis_asset_tag",
)
#: The asset tag Azure gives every virtual machine.
AZURE_ASSET_TAG = "7783-7084-3265-9085"


def read_machine(sysfs: Path = Path("/sys")) -> dict[str, str]:
    """The DMI strings of this machine (and Xen's ``hypervisor_uuid``); missing files are left out."""
    files = {name: sysfs / "class" / "dmi" / "id" / name for name in DMI_FIELDS}
    files["hypervisor_uuid"] = sysfs / "hypervisor" / "uuid"
    found: dict[str, str] = {}
    for name, path in files.items():
        with contextlib.suppress(OSError):
            found[name] = path.read_text(errors="replace").strip()
    return found


def on_aws(machine: Mapping[str, str]) -> bool:
    """EC2: Nitro machines say ``Amazon EC2``; older Xen ones have an ``ec2`` uuid or an ``amazon`` BIOS."""
    vendors = (machine.get("sys_vendor", ""), machine.get("bios_vendor", ""))
    return (
        any(vendor.startswith("Amazon EC2") for vendor in vendors)
        or machine.get("hypervisor_uuid", "").lower().startswith("ec2")
        or "amazon" in machine.get("bios_version", "").lower()
    )


def on_gce(machine: Mapping[str, str]) -> bool:
    """Google Compute Engine: product ``Google Compute Engine``, vendor ``Google``."""
    return machine.get("product_name") == "Google Compute Engine" or machine.get("sys_vendor") == "Google"


def on_azure(machine: Mapping[str, str]) -> bool:
    """Azure: its fixed chassis asset tag (``Microsoft Corporation`` alone is any Hyper-V machine)."""
    return machine.get("chassis_asset_tag") == AZURE_ASSET_TAG
