"""Checkpoints load as data only (model.data_only): each attack beside its honest twin."""

import pickle
from pathlib import Path

import pytest
import torch

from softtokens.model.data_only import (
    UnsafePickle,
    data_only_problem,
    read_dcp_metadata,
    safe_planner,
    safe_reader,
)


class _Payload:
    """What a malicious pickle does: call something with arguments of its choosing as it is loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def _checkpoint(d: Path, tiny_model, toy_tokenizer) -> Path:
    tiny_model.save_pretrained(d)
    toy_tokenizer.save_pretrained(d)
    return d


def test_a_checkpoint_of_safetensors_and_json_is_data_only_and_a_pickle_or_zip_is_not(tmp_path, tiny_model,
                                                                                       toy_tokenizer):
    ckpt = _checkpoint(tmp_path / "ckpt", tiny_model, toy_tokenizer)
    assert data_only_problem(ckpt) is None                      # the honest twin: what save_pretrained writes
    marker = tmp_path / "ran"
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps(_Payload(marker), protocol=4))
    assert "pytorch_model.bin is a pickle" in data_only_problem(ckpt)
    (ckpt / "pytorch_model.bin").unlink()
    torch.save({"w": torch.zeros(2)}, ckpt / "extra.pt")
    assert "extra.pt is a zip archive" in data_only_problem(ckpt)
    (ckpt / "extra.pt").unlink()
    (ckpt / "model.safetensors").write_bytes(b"\x80\x04" + b"x" * 100)   # a pickle under the weights' name
    assert "model.safetensors is a pickle" in data_only_problem(ckpt)
    (ckpt / "model.safetensors").write_bytes(b"\xff" * 64)
    assert "is not safetensors" in data_only_problem(ckpt)
    (ckpt / "model.safetensors").unlink()
    (ckpt / "weights.npy").write_bytes(b"\x93NUMPY")
    assert "weights.npy: a .npy file is none of a checkpoint's data-only formats" in data_only_problem(ckpt)
    assert not marker.exists()


def test_the_optimizer_state_round_trips_through_the_data_only_reader_and_a_forged_metadata_is_refused(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    out = tmp_path / "resume" / "optimizer"
    dcp.save({"optimizer": get_optimizer_state_dict(model, opt)}, checkpoint_id=str(out))
    assert data_only_problem(out.parent) is None                # the honest twin: torch's own DCP files
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    fresh.step()   # another state of the same shapes, to be overwritten by the load
    state = {"optimizer": get_optimizer_state_dict(model, fresh)}
    dcp.load(state, storage_reader=safe_reader(out), planner=safe_planner())
    for key in ("exp_avg", "exp_avg_sq"):
        got = state["optimizer"]["state"]["weight"][key]
        assert torch.equal(got, opt.state[model.weight][key]), key

    marker = tmp_path / "ran"
    (out / ".metadata").write_bytes(pickle.dumps(_Payload(marker), protocol=4))
    with pytest.raises(UnsafePickle, match="pathlib.Path.touch|Path.touch|touch"):
        read_dcp_metadata(out / ".metadata")
    problem = data_only_problem(out.parent)
    assert problem and ".metadata asks to build" in problem and "nothing was built from it" in problem
    assert not marker.exists()
