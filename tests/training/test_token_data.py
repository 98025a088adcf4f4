"""Token shards, the distributed loader's determinism and position, and the data-channel contract."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from training.data import (
    HEADER_BYTES,
    MAGIC,
    DistributedTokenLoader,
    ShardError,
    TokenSamples,
    read_shard,
    validation_batches,
    write_shard,
)
from training.sagemaker_contract import ContractError, Paths, find_data_files


def test_shard_round_trip_in_llm_c_layout(tmp_path: Path) -> None:
    tokens = np.arange(1000) % 50257
    write_shard(tmp_path / "a.bin", tokens)
    raw = (tmp_path / "a.bin").read_bytes()
    header = np.frombuffer(raw[:HEADER_BYTES], dtype=np.int32)
    assert list(header[:3]) == [MAGIC, 1, 1000]
    assert len(raw) == HEADER_BYTES + 2 * 1000  # uint16 tokens
    assert np.array_equal(read_shard(tmp_path / "a.bin"), tokens)


def test_ids_beyond_uint16_use_version_2(tmp_path: Path) -> None:
    write_shard(tmp_path / "big.bin", [1, 70000, 128255])
    shard = read_shard(tmp_path / "big.bin")
    assert shard.dtype == np.uint32
    assert shard.tolist() == [1, 70000, 128255]


def test_malformed_shards_are_rejected_with_the_file_name(tmp_path: Path) -> None:
    write_shard(tmp_path / "ok.bin", np.arange(100))
    truncated = tmp_path / "truncated.bin"
    truncated.write_bytes((tmp_path / "ok.bin").read_bytes()[:-10])
    with pytest.raises(ShardError, match=r"truncated\.bin: header says 100 tokens"):
        read_shard(truncated)
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x01" * 2048)
    with pytest.raises(ShardError, match=r"garbage\.bin: magic .* is not 20240520"):
        read_shard(garbage)


@pytest.fixture
def samples(tmp_path: Path) -> TokenSamples:
    # Two shards of different lengths; with seq_len 8 they hold 12 + 7 samples.
    write_shard(tmp_path / "s0.bin", np.arange(0, 97))
    write_shard(tmp_path / "s1.bin", np.arange(1000, 1060))
    return TokenSamples([tmp_path / "s0.bin", tmp_path / "s1.bin"], seq_len=8)


def test_samples_are_overlapping_windows_within_each_shard(samples: TokenSamples) -> None:
    assert samples.n_samples == 12 + 7
    batch = samples.gather(np.array([0, 11, 12, 18]))
    assert batch[0].tolist() == list(range(0, 9))
    assert batch[1].tolist() == list(range(88, 97))
    assert batch[2].tolist() == list(range(1000, 1009))
    assert batch[3].tolist() == list(range(1048, 1057))


@pytest.fixture
def shifted(tmp_path: Path) -> TokenSamples:
    # The same shards with window grids that move: the last 7 tokens of each start no window.
    write_shard(tmp_path / "s0.bin", np.arange(0, 97))
    write_shard(tmp_path / "s1.bin", np.arange(1000, 1060))
    return TokenSamples([tmp_path / "s0.bin", tmp_path / "s1.bin"], seq_len=8, shifted=True)


def test_shifted_windows_start_shift_tokens_in_and_keep_their_count(shifted: TokenSamples) -> None:
    assert shifted.n_samples == 11 + 6
    assert shifted.gather(np.array([0, 10, 11]), shift=7).tolist() == [
        list(range(7, 16)),
        list(range(87, 96)),
        list(range(1007, 1016)),
    ]
    assert shifted.gather(np.array([16]), shift=7)[0, -1] == 1055  # the last window still fits in its shard
    with pytest.raises(ValueError, match="shift 3 needs shifted samples"):
        TokenSamples(shifted.paths, seq_len=8).gather(np.array([0]), shift=3)


def test_every_epoch_moves_the_grid_and_resumes_exactly_on_another_world_size(shifted: TokenSamples) -> None:
    loader = _loader(shifted, 0, 1, micro=1)
    shifts = [loader.shift_for(epoch) for epoch in range(6)]
    assert len(set(shifts)) > 1 and all(0 <= s < 8 for s in shifts)
    for epoch in range(2):
        firsts = sorted(int(loader.next_batch()[0, 0]) for _ in range(shifted.n_samples))
        expected = sorted(int(t) for t in shifted.gather(np.arange(shifted.n_samples), shift=shifts[epoch])[:, 0])
        assert firsts == expected
    state = _loader(shifted, 0, 2, micro=2)
    for _ in range(7):  # into the second epoch
        state.next_batch()
    reference = _loader(shifted, 0, 1, micro=4)
    reference.load_state_dict(state.state_dict())
    after = [_loader(shifted, r, 2, micro=2) for r in range(2)]
    for a in after:
        a.load_state_dict(state.state_dict())
    for _ in range(6):
        assert np.array_equal(np.concatenate([a.next_batch() for a in after]), reference.next_batch())


def _loader(samples: TokenSamples, rank: int, world: int, micro: int, shuffle: bool = True) -> DistributedTokenLoader:
    return DistributedTokenLoader(samples, micro_batch=micro, rank=rank, world_size=world, seed=3, shuffle=shuffle)


def test_ranks_split_the_same_global_stream_as_one_process(samples: TokenSamples) -> None:
    single = _loader(samples, 0, 1, micro=4)
    pair = [_loader(samples, r, 2, micro=2) for r in range(2)]
    for _ in range(12):  # more than two epochs
        expected = single.next_batch()
        got = np.concatenate([loader.next_batch() for loader in pair])
        assert np.array_equal(got, expected)
    assert single.consumed == pair[0].consumed == 48


def test_each_epoch_visits_every_sample_once_in_a_new_order(samples: TokenSamples) -> None:
    loader = _loader(samples, 0, 1, micro=1)
    epochs = [[int(loader.next_batch()[0, 0]) for _ in range(samples.n_samples)] for _ in range(2)]
    firsts = sorted(int(samples.gather(np.array([i]))[0, 0]) for i in range(samples.n_samples))
    assert sorted(epochs[0]) == sorted(epochs[1]) == firsts
    assert epochs[0] != epochs[1]
    unshuffled = _loader(samples, 0, 1, micro=1, shuffle=False)
    assert [int(unshuffled.next_batch()[0, 0]) for _ in range(3)] == firsts[:3]


def test_position_resumes_exactly_even_on_another_world_size(samples: TokenSamples) -> None:
    before = _loader(samples, 0, 2, micro=2)
    for _ in range(5):
        before.next_batch()
    state = before.state_dict()
    reference = _loader(samples, 0, 1, micro=4)
    reference.load_state_dict(state)
    after = [_loader(samples, r, 2, micro=2) for r in range(2)]
    for loader in after:
        loader.load_state_dict(state)
    for _ in range(6):
        assert np.array_equal(np.concatenate([a.next_batch() for a in after]), reference.next_batch())


def test_a_different_seq_len_resumes_at_the_same_token_count(samples: TokenSamples) -> None:
    loader = _loader(samples, 0, 1, micro=2)
    loader.load_state_dict({"samples_consumed": 10, "seq_len": 4})
    assert loader.consumed == 5  # 40 tokens of 8-token samples


def test_too_little_data_for_one_batch_says_what_to_change(samples: TokenSamples) -> None:
    with pytest.raises(ShardError, match=r"19 training samples .* cannot fill one batch of 8 x 4 processes"):
        _loader(samples, 0, 4, micro=8)


@pytest.mark.parametrize(("world", "micro", "limit"), [(1, 4, 100), (2, 4, 100), (3, 2, 10), (4, 8, 5)])
def test_validation_covers_the_same_samples_once_on_any_world_size(
    samples: TokenSamples, world: int, micro: int, limit: int
) -> None:
    per_rank = [
        validation_batches(samples, micro_batch=micro, rank=r, world_size=world, max_sequences=limit)
        for r in range(world)
    ]
    assert len({len(batches) for batches in per_rank}) == 1  # FSDP forwards are collective
    seen = [int(tokens[i, 0]) for batches in per_rank for tokens, valid in batches for i in range(valid)]
    expected = [int(t) for t in samples.gather(np.arange(min(samples.n_samples, limit)))[:, 0]]
    assert sorted(seen) == sorted(expected)


@pytest.mark.parametrize(("world", "micro", "batches"), [(1, 4, 3), (2, 2, 3), (3, 2, 2)])
def test_sampled_validation_is_one_seeded_draw_shared_out_over_ranks(
    samples: TokenSamples, world: int, micro: int, batches: int
) -> None:
    def draw(seed: int) -> list[list[tuple[np.ndarray, int]]]:
        return [
            validation_batches(
                samples,
                micro_batch=micro,
                rank=r,
                world_size=world,
                max_sequences=10**9,
                sample_batches=batches,
                seed=seed,
            )
            for r in range(world)
        ]

    per_rank = draw(seed=7)
    assert {len(b) for b in per_rank} == {batches}
    firsts = [int(tokens[i, 0]) for ranks in per_rank for tokens, valid in ranks for i in range(valid)]
    assert len(firsts) == len(set(firsts)) == batches * micro * world  # each drawn window once, no padding
    everything = {int(t) for t in samples.gather(np.arange(samples.n_samples))[:, 0]}
    assert set(firsts) < everything  # a sample, not the first windows: spread over the whole set
    assert max(firsts) > sorted(everything)[batches * micro * world]
    again = [int(tokens[i, 0]) for ranks in draw(seed=7) for tokens, valid in ranks for i in range(valid)]
    other = [int(tokens[i, 0]) for ranks in draw(seed=8) for tokens, valid in ranks for i in range(valid)]
    assert again == firsts and other != firsts
    # A sample as large as the set is the set.
    whole = validation_batches(samples, micro_batch=micro, rank=0, world_size=1, max_sequences=8, sample_batches=100)
    assert [int(t) for tokens, valid in whole for t in tokens[:valid, 0]] == sorted(everything)[:8]


def _channel(paths: Paths, name: str, files: list[str]) -> None:
    paths.channel(name).mkdir(parents=True)
    for file in files:
        write_shard(paths.channel(name) / file, np.arange(10))


def test_validation_comes_from_val_files_in_train_without_a_validation_channel(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    _channel(paths, "train", ["train_000001.bin", "train_000000.bin", "fineweb_val_000000.bin"])
    files = find_data_files(paths)
    assert [p.name for p in files.train] == ["train_000000.bin", "train_000001.bin"]
    assert [p.name for p in files.validation] == ["fineweb_val_000000.bin"]


def test_the_validation_channel_takes_precedence(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    _channel(paths, "train", ["a.bin", "a_val.bin"])
    _channel(paths, "validation", ["heldout.bin"])
    files = find_data_files(paths)
    assert [p.name for p in files.train] == ["a.bin"]
    assert [p.name for p in files.validation] == ["heldout.bin"]


def test_missing_or_empty_train_channel_names_channel_and_path(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    with pytest.raises(ContractError, match=rf"channel 'train' is missing: expected a directory at {tmp_path}"):
        find_data_files(paths)
    _channel(paths, "train", ["only_val.bin"])
    with pytest.raises(ContractError, match=r"channel 'train' at .* has no training shards"):
        find_data_files(paths)


def test_a_sampled_validation_set_for_fewer_processes_is_part_of_the_one_for_more(samples: TokenSamples) -> None:
    """A resume on another process count evaluates mostly the same windows as before it."""

    def drawn(world: int) -> set[int]:
        return {
            int(tokens[i, 0])
            for rank in range(world)
            for tokens, valid in validation_batches(
                samples, micro_batch=2, rank=rank, world_size=world, max_sequences=10**9, sample_batches=3, seed=7
            )
            for i in range(valid)
        }

    one, two, three = drawn(1), drawn(2), drawn(3)
    assert len(one) == 6 and len(two) == 12 and len(three) == 18
    assert one < two < three
