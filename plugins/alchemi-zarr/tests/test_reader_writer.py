"""AtomicDataZarrWriter and AtomicDataZarrReader: datasets, random access, metadata, samplers."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from zarr_test_helpers import assert_matches_id, batch_for, memory_url, structure_for

from alchemi_core.data import Batch
from alchemi_core.data.datapipes import Dataset
from alchemi_core.dynamics import SizeAwareSampler
from alchemi_core.errors import InvalidDataError
from alchemi_core.testing import make_batch, random_structures
from alchemi_core.testing.contracts import assert_same_systems
from alchemi_zarr import AtomicDataZarrReader, AtomicDataZarrWriter, ZarrData


def test_writer_takes_structures_lists_and_batches_in_blocks():
    url = memory_url()
    writer = AtomicDataZarrWriter(url, block_size=3)
    assert writer.write([structure_for(i) for i in range(7)]) == 7
    assert writer.write(structure_for(7)) == 1
    assert writer.write(batch_for([8, 9])) == 2
    reader = AtomicDataZarrReader(url)
    assert len(reader) == len(writer) == 10
    for i in range(10):
        assert_matches_id(reader[i])
    with pytest.raises(InvalidDataError, match="item 1 is a str"):
        writer.write([structure_for(0), "not a structure"])


def test_random_access_matches_what_was_written_across_chunk_boundaries():
    url = memory_url()
    AtomicDataZarrWriter(url).write([structure_for(i) for i in range(3000)])  # ~15000 atoms
    reader = AtomicDataZarrReader(url, cache_chunks=2)
    for i in [0, 2999, 1500, 1, 1637, 1638, 1639, 2998, 7, -1]:
        assert_matches_id(reader[i])
    assert reader[-1].system_id.item() == 2999
    with pytest.raises(IndexError, match="out of range"):
        reader[3000]
    assert sum(1 for _ in AtomicDataZarrReader(url)) == 3000  # sequential iteration


def test_metadata_comes_from_the_pointers_alone(tmp_path):
    path = tmp_path / "meta.zarr"
    structures = [structure_for(i) for i in range(50)]
    AtomicDataZarrWriter(str(path)).write(structures)
    # Remove every data chunk: only metadata, pointers and the commit remain.
    removed = [c for level in ("atoms", "edges", "systems") for c in (path / level).glob("*/c")]
    assert len(removed) == 8  # numbers, positions, forces; neighbor_list; cell, pbc, energy, system_id
    for chunks in removed:
        shutil.rmtree(chunks)
    reader = AtomicDataZarrReader(str(path))
    atoms, edges = reader.get_all_metadata()
    assert atoms.tolist() == [s.num_nodes for s in structures]
    assert edges.tolist() == [s.num_edges for s in structures]
    assert reader.get_metadata(9) == (structures[9].num_nodes, structures[9].num_edges)
    assert atoms.dtype == np.int64
    assert reader[0].positions.abs().sum() == 0  # the data itself is gone (fill values)


def test_reader_reads_what_the_sink_wrote_and_the_sink_what_the_writer_wrote():
    url = memory_url()
    sink = ZarrData(url)
    batch = make_batch([3, 4], edges=True, extras=True)
    sink.write(batch)
    reader = AtomicDataZarrReader(url)
    assert_same_systems(batch, Batch.from_data_list([reader[0], reader[1]]))
    assert reader.fields["charges"]["dtype"] == "float64"
    other = memory_url()
    AtomicDataZarrWriter(other).write(batch.to_data_list())
    assert_same_systems(batch, ZarrData(other).read())


def test_read_batch_and_refresh_follow_a_growing_store():
    url = memory_url()
    sink = ZarrData(url)
    sink.write(batch_for([0, 1, 2]))
    reader = AtomicDataZarrReader(url)
    sink.write(batch_for([3, 4]))
    assert len(reader) == 3
    assert reader.refresh() == 5
    assert_same_systems(batch_for([1, 2, 3]), reader.read_batch(1, 4))
    assert_matches_id(reader[4])


def test_an_invalid_stored_structure_names_its_record():
    url = memory_url()
    batch = batch_for([0, 1])
    batch.positions[2:, 0] = float("nan")  # a sink stores what it is given, blown-up systems too
    ZarrData(url).write(batch)
    reader = AtomicDataZarrReader(url)
    assert_matches_id(reader[0])
    with pytest.raises(InvalidDataError, match="record 1 of .* NaN"):
        reader[1]
    with pytest.raises(InvalidDataError, match="record 1 of .* NaN"):  # a batch read checks as reader[i] does
        ZarrData(url).read()
    assert_matches_id(reader.read_batch(0, 1).to_data_list()[0])  # the records around it still read


def test_dataset_and_size_aware_sampler_stream_the_store():
    url = memory_url()
    structures = random_structures([3, 8, 5, 2, 7, 4, 6, 1])
    AtomicDataZarrWriter(url).write(structures)
    dataset = Dataset(AtomicDataZarrReader(url), device="cpu")
    sampler = SizeAwareSampler(dataset=dataset, max_atoms=12, max_edges=None, max_batch_size=3, bin_width=2)
    batch = sampler.build_initial_batch()
    assert sum(batch.num_nodes_list) <= 12 and batch.num_graphs <= 3
    seen = batch.system_id.tolist()
    while not sampler.exhausted:
        seen.append(int(sampler.request_replacement(num_atoms=12, num_edges=None).system_id))
    assert sorted(seen) == list(range(8))
    assert dataset.get_all_metadata()[0].tolist() == [3, 8, 5, 2, 7, 4, 6, 1]
