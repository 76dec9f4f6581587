"""The whole line of the errors users meet most, in one place: a rewording of these is made here, on purpose.
Every other test checks what a message names (tests/messages.py), not its sentence."""

import pytest

from tests.messages import names, not_names, one_line, suggestion, usage_error
from trainer.flags import parse_args

TRAIN = "python -m trainer.train: error: "


@pytest.mark.parametrize("argv, line", [
    (["--num-evns", "8"], "unrecognized arguments: --num-evns 8 (did you mean --num-envs?) (see --help)"),
    (["--num-envs", "0"], "--num-envs must be >= 1, got 0 (see --help)"),
    (["--device", "gpu"], "--device must be auto, cpu, cuda or cuda:N, got 'gpu' (did you mean cuda?) (see --help)"),
    (["--max-lag", "2"], "unrecognized arguments: --max-lag 2 (max_lag has no flag: set max_lag = ... in a --config "
                         "TOML file) (see --help)"),
    (["--resume", "{tmp}/nowhere"], "--resume {tmp}/nowhere: no such checkpoint file or run directory (see --help)"),
])
def test_flag_errors_word_for_word(tmp_path, capsys, argv, line):
    with pytest.raises(SystemExit) as stop:
        parse_args([a.format(tmp=tmp_path) for a in argv])
    said = usage_error(stop.value.code, capsys.readouterr().err)
    assert said == TRAIN + line.format(tmp=tmp_path)


@pytest.mark.parametrize("body, line", [
    ("num-env = 8\n", "unknown keys in {toml}: num-env (did you mean num-envs?) (keys are the flag names, with "
                      "hyphens or underscores) (see --help)"),
    ('num_envs = "8"\n', '{toml}: num_envs = "8" is a string, expected an integer (e.g. num_envs = 4) (see --help)'),
    ("total-steps = 1e6\n", "{toml}: total_steps = 1000000.0 is a float, expected an integer (e.g. total_steps = "
                            "1_000_000) (see --help)"),
    ("num_envs = 0\n", "{toml}: num_envs = 0: must be >= 1 (see --help)"),
])
def test_config_file_errors_word_for_word(tmp_path, capsys, body, line):
    toml = tmp_path / "run.toml"
    toml.write_text(body)
    with pytest.raises(SystemExit) as stop:
        parse_args(["--config", str(toml)])
    said = usage_error(stop.value.code, capsys.readouterr().err)
    assert said == TRAIN + line.format(toml=toml)


def test_a_thing_is_named_whole_whatever_the_sentence_around_it():
    """The checks every other test makes (tests/messages.py): the old and the new form of one message name the
    same things; a longer flag or another number does not pass for the one named."""
    for said in ["--num-envs=0 is invalid: must be >= 1", "--num-envs must be >= 1, got 0"]:
        names(said, "--num-envs", 0, 1)
    for said, thing in [("--num-envs-per-worker=0 is invalid", "--num-envs"), ("--num-envs=10", "0"),
                        ("--seed=-1", "1"), ("got 0.5", "0"), ("num_envs_total", "num_envs")]:
        with pytest.raises(AssertionError):
            names(said, thing)
    not_names("--num-envs-per-worker=0", "--num-envs")
    assert suggestion("unrecognized arguments: --num-evns 8 (did you mean --num-envs?) (see --help)") == "--num-envs"
    assert suggestion("--device must be auto, cpu, cuda or cuda:N, got 'gpu' (did you mean cuda?)") == "cuda"
    assert suggestion("--num-envs must be >= 1, got 0") is None
    with pytest.raises(AssertionError):
        one_line("first\nsecond")
    names("autoreset_mode=AutoresetMode.NEXT_STEP", "NEXT_STEP")  # a name after a dot is a name
