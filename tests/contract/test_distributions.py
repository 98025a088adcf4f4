"""mpirun's names for a process's place, read as torchrun's (contract/distributions.py)."""

from contract.distributions import MPI_TO_TORCHRUN, global_rank, torchrun_variables


def test_mpirun_names_fill_only_the_unset_torchrun_names() -> None:
    environ = {
        "OMPI_COMM_WORLD_RANK": "3",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "WORLD_SIZE": "8",
    }
    torchrun_variables(environ)
    assert {name: environ[name] for name in MPI_TO_TORCHRUN.values()} == {
        "RANK": "3",
        "WORLD_SIZE": "8",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }


def test_the_global_rank_is_torchruns_then_mpiruns_then_zero() -> None:
    assert global_rank({"RANK": "2", "OMPI_COMM_WORLD_RANK": "5"}) == 2
    assert global_rank({"OMPI_COMM_WORLD_RANK": "5"}) == 5
    assert global_rank({}) == 0
