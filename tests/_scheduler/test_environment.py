from __future__ import annotations

from lightning_resume._scheduler.environment import expects_peers, is_global_zero, launch_key, read_session


def test_slurm_key_includes_array_task_and_restart_flag() -> None:
    session = read_session({"SLURM_JOB_ID": "12", "SLURM_ARRAY_TASK_ID": "3", "SLURM_RESTART_COUNT": "1"})
    assert (session.key, session.source, session.scheduler_restart) == ("12_3", "slurm", True)


def test_slurm_first_attempt_is_not_a_restart() -> None:
    assert not read_session({"SLURM_JOB_ID": "12"}).scheduler_restart
    assert not read_session({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "0"}).scheduler_restart


def test_explicit_key_wins_over_schedulers() -> None:
    env = {"SLURM_JOB_ID": "12", "TORCHELASTIC_RUN_ID": "e", "LIGHTNING_RESUME_KEY": "from-env"}
    assert read_session(env).key == "from-env"
    assert read_session(env, key="arg").key == "arg"
    assert read_session(env, key="arg").source == "explicit"


def test_slurm_wins_over_torchelastic_inside_an_allocation() -> None:
    env = {"SLURM_JOB_ID": "12", "TORCHELASTIC_RUN_ID": "e", "TORCHELASTIC_RESTART_COUNT": "1"}
    session = read_session(env)
    assert (session.key, session.scheduler_restart) == ("12", True)


def test_torchelastic_session() -> None:
    session = read_session({"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "2"})
    assert (session.key, session.source, session.scheduler_restart) == ("abc", "torchelastic", True)


def test_no_scheduler_means_no_key() -> None:
    assert read_session({}).key is None


def test_rank_detection_for_each_launcher() -> None:
    assert is_global_zero({})
    assert not is_global_zero({"RANK": "1"})
    assert not is_global_zero({"SLURM_PROCID": "1"})
    assert not is_global_zero({"LOCAL_RANK": "1"})
    assert not is_global_zero({"LOCAL_RANK": "0", "NODE_RANK": "1"})


def test_launch_key_changes_between_steps_and_restarts() -> None:
    base = {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"}
    assert launch_key(base) != launch_key({**base, "SLURM_STEP_ID": "1"})
    assert launch_key(base) != launch_key({**base, "SLURM_RESTART_COUNT": "1"})
    assert launch_key({"TORCHELASTIC_RUN_ID": "r"}) != launch_key(
        {"TORCHELASTIC_RUN_ID": "r", "TORCHELASTIC_RESTART_COUNT": "1"}
    )
    assert launch_key({}) is None
    # The same on every node of a launch by hand (Lightning's own multi-node launch).
    assert launch_key({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}) == "local-127.0.0.1-1234"


def test_expects_peers() -> None:
    assert not expects_peers({})
    assert expects_peers({"WORLD_SIZE": "2"})
    assert expects_peers({"SLURM_NTASKS": "4"})
