"""The result plots are drawn from the bench's JSON, the committed one included."""

import json

import pytest

from experiments import plot


def entry(shares, error=None):
    meta = {"threads": 2, "cpu": "test CPU"}
    collage = {"backend_shares": shares, "error": error, "median_ms": 1.0, "p25_ms": 0.9, "p75_ms": 1.1}
    return {"description": "a model", "input_shapes": [[1, 3]], "meta": meta, "peers": {"collage": collage}}


def test_shares_are_stacked_per_model(tmp_path):
    results = {"a": entry({"openvino": 0.75, "tvm": 0.25}), "b": entry({}, error="failed"), "c": entry({"tvm": 1.0})}
    (tmp_path / "peers.json").write_text(json.dumps(results))
    plot.plot_shares(tmp_path / "peers.json", tmp_path / "shares.png")
    assert (tmp_path / "shares.png").read_bytes().startswith(b"\x89PNG")


def test_shares_need_a_collage_result(tmp_path):
    (tmp_path / "peers.json").write_text(json.dumps({"b": entry({}, error="failed")}))
    with pytest.raises(ValueError, match="no model has a collage result"):
        plot.plot_shares(tmp_path / "peers.json", tmp_path / "shares.png")


def test_both_plots_come_from_the_committed_results(tmp_path):
    plot.main([str(plot.DEFAULT_RESULTS), str(tmp_path / "peers.png")])
    assert (tmp_path / "peers.png").stat().st_size > 0 and (tmp_path / "peers_shares.png").stat().st_size > 0
