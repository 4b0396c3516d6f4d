"""Entry point of alchemi-zarr: registers its components as strings; imports nothing heavy."""

from __future__ import annotations

from typing import TYPE_CHECKING

from alchemi_core.plugin import hookimpl

if TYPE_CHECKING:
    from alchemi_core.plugin.registrar import Registrar

_REQUIRES = {"zarr": "alchemi-zarr", "fsspec": "alchemi-zarr"}


@hookimpl
def alchemi_register_sinks(registrar: Registrar) -> None:
    registrar.add(
        "zarr",
        "alchemi_zarr.sink:ZarrData",
        summary="crash-safe Zarr v3 store on a path or any fsspec URL (optionally written in the background)",
        exports=["alchemi_core.dynamics.ZarrData"],
        requires=_REQUIRES,
    )
    registrar.export("alchemi_core.data.datapipes.AtomicDataZarrReader", "alchemi_zarr.reader:AtomicDataZarrReader")
    registrar.export("alchemi_core.data.datapipes.AtomicDataZarrWriter", "alchemi_zarr.writer:AtomicDataZarrWriter")
    # What core's workflows ask of a results store, by public name (core imports no plugin).
    registrar.export("alchemi_core.data.datapipes.ShardedZarrStore", "alchemi_zarr.sharded_store:ShardedZarrStore")
    registrar.export("alchemi_core.data.datapipes.open_results_reader", "alchemi_zarr.sharded:open_reader")
    registrar.export("alchemi_core.data.datapipes.check_unique_results", "alchemi_zarr.validity:check_unique")
