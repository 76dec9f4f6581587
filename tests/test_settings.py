"""Settings declared once, beside their owner: the flags, TOML keys and limits that follow from the
declarations (``envs.settings``, ``trainer.config``, ``trainer.ppo.settings``, ``trainer.apex.settings``)."""

import argparse
import dataclasses
import math

import pytest

from envs.settings import ConfigError, limits_of
from envs.vr_edge import VREdgeConfig
from tests.messages import suggestion
from trainer.config import TrainConfig, setting_fields, with_current_names
from trainer.flags import build_parser, parse_args, resumed_config, without_flags
from trainer.registry import ALGORITHMS, owners, reads


def shown_flags(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions if a.help != argparse.SUPPRESS for o in a.option_strings if o.startswith("--")]


def test_help_shows_at_most_45_flags_grouped_by_owner():
    parser = build_parser()
    assert len(shown_flags(parser)) <= 45
    groups = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    assert {"num_envs", "backend", "threads"} <= groups["collection"]
    assert {"lr", "gamma"} <= groups["learning (every algorithm)"]
    assert {"epochs", "minibatch_size"} <= groups[f"ppo ({ALGORITHMS['ppo'].description})"]
    assert {"replay_capacity", "n_step"} <= groups[f"apex ({ALGORITHMS['apex'].description})"]
    assert set(without_flags()) & {a.dest for a in parser._actions} == set()


def test_every_setting_is_documented_and_owned_once():
    run = {f.name for f in dataclasses.fields(TrainConfig)}
    for owner, f in setting_fields():
        assert f.metadata.get("help"), f"{f.name} has no help"
        if owner:  # an algorithm's: not also the run's
            assert f.name not in run
    assert owners("minibatch_size") == ("ppo", "apex")  # one name, each algorithm's own default
    apex, ppo = TrainConfig.from_dict({"algo": "apex"}), TrainConfig()
    assert apex.algo_settings.minibatch_size != ppo.algo_settings.minibatch_size


def _outside(f: dataclasses.Field):
    """A value just outside the declared limits of ``f`` (``None`` where it declares none)."""
    limits, kind = limits_of(f), type(f.default)
    if limits.choices:
        return "not-a-choice"
    if limits.at_least is not None:
        return kind(limits.at_least - 1) if kind is int else limits.at_least - 0.5
    if limits.above is not None:
        return kind(limits.above)
    if limits.at_most is not None:
        return kind(limits.at_most + 1) if kind is int else limits.at_most + 0.5
    return None


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_every_declared_limit_refuses_the_value_just_outside_it_naming_the_setting(algo):
    checked = 0
    for _, f in setting_fields():
        if not reads(algo, f.name) or (bad := _outside(f)) is None:
            continue
        with pytest.raises(ConfigError) as e:
            TrainConfig.from_dict({"algo": algo, f.name: bad}).validate()
        assert e.value.key == f.name and e.value.value == bad, f.name
        assert "\n" not in str(e.value)
        checked += 1
    assert checked >= 15


def test_every_vr_edge_limit_refuses_the_value_just_outside_it_naming_the_argument():
    """VR-edge's arguments are declared as the trainer's settings are, and checked by the same rule: the message
    names the argument by its key (an env argument has no flag)."""
    checked = 0
    for f in (f for f in dataclasses.fields(VREdgeConfig) if f.init):
        bad = (*f.default[:-1], limits_of(f).above) if isinstance(f.default, tuple) else _outside(f)
        if bad is None:
            continue
        with pytest.raises(ConfigError) as e:
            VREdgeConfig(**{f.name: bad})
        assert (e.value.key, e.value.value) == (f.name, bad) and str(e.value).startswith(f"{f.name} must "), f.name
        checked += 1
    assert checked >= 20


@pytest.mark.parametrize("name", ["lr", "gamma", "max_grad_norm", "clip_coef"])
def test_a_float_that_is_not_finite_is_refused(name):
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_dict({name: math.inf}).validate()
    assert e.value.key == name


def test_a_setting_without_a_flag_is_a_toml_key_and_named_so_on_the_command_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--max-lag", "2"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "max_lag" in err and "--config" in err and err.count("\n") == 1
    (tmp_path / "run.toml").write_text("max_lag = 2\nrho-bar = 0.5\n")
    cfg = parse_args(["--config", str(tmp_path / "run.toml")]).config
    assert (cfg.algo_settings.max_lag, cfg.algo_settings.rho_bar) == (2, 0.5)
    with pytest.raises(ConfigError) as bad:
        TrainConfig.from_dict({"max_lag": -1}).validate()
    assert str(bad.value).startswith("max_lag ")  # its TOML key: there is no --max-lag to name


def test_an_old_spelling_is_an_unknown_setting_that_suggests_the_new_one(tmp_path, capsys):
    """0.1.0 was never released: the names it had before are not kept, as flags or as TOML keys."""
    (tmp_path / "old.toml").write_text('algo = "apex"\napex_batch_size = 32\n')
    for argv, named, new in ((["--batch-size", "256"], "--batch-size", "--minibatch-size"),
                             (["--algo", "apex", "--apex-batch-size", "64"], "--apex-batch-size", "--minibatch-size"),
                             (["--backend", "ray", "--ray-async", "true"], "--ray-async", "--keep-collecting"),
                             (["--config", str(tmp_path / "old.toml")], "apex_batch_size", "minibatch_size")):
        with pytest.raises(SystemExit) as e:
            parse_args(argv)
        err = capsys.readouterr().err
        assert e.value.code == 2 and named in err and err.count("\n") == 1, argv
        assert suggestion(err) == new, err


def test_python_takes_the_keys_a_toml_file_takes_and_names_another_algorithms():
    assert TrainConfig.from_dict({"num-envs": 8, "max-lag": 2}).algo_settings.max_lag == 2
    with pytest.raises(ConfigError) as e:
        TrainConfig.from_dict({"algo": "apex", "epochs": 3})
    assert e.value.key == "epochs" and "ppo" in str(e.value)


def test_a_switch_alone_means_true():
    cfg = parse_args(["--overlap", "--tensorboard", "false"]).config
    assert (cfg.overlap, cfg.tensorboard) == (True, False)


@pytest.mark.parametrize("algo, backend, ray_async", [("ppo", "ray", True), ("apex", "async", False)])
def test_a_config_stored_by_an_older_version_resumes(algo, backend, ray_async):
    """It held every algorithm's settings, flat, and keep_collecting under its old name, ray_async."""
    every = {f.name: f.default for _, f in setting_fields() if f.name != "keep_collecting"}
    stored = with_current_names({**every, "algo": algo, "env": "CartPole-v1", "device": "cpu", "backend": backend,
                                 "ray_async": ray_async, "minibatch_size": 64})
    cfg = resumed_config(stored, {"total_steps": 10**7}, "ckpt_9.pt")
    assert cfg.algo == algo and cfg.algo_settings.minibatch_size == 64 and cfg.total_steps == 10**7
    assert cfg.keep_collecting is ray_async
    assert TrainConfig.from_dict(stored, stored=True) == resumed_config(stored, {}, "ckpt_9.pt")


def test_a_config_error_crosses_to_another_process_whole():
    """Raised in a worker process (a spawned pool's), it is pickled to the parent: the same message and fields."""
    import pickle

    error = ConfigError("users", "20-4", "must be within 1..12", hint=" (or fewer)")
    again = pickle.loads(pickle.dumps(error))
    assert (type(again), str(again), again.key, again.value, again.rule, again.hint) == \
        (ConfigError, str(error), "users", "20-4", "must be within 1..12", " (or fewer)")
