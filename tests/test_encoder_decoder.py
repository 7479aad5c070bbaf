"""``--decode`` on encoder-decoders (T5, Whisper): the encoder runs once, in the prefill; each
step runs the decoder on the new tokens after a self-attention cache of ``--decode`` tokens and
the cross-attention cache of the encoder's output, which does not grow. Oracles: the cache's
bytes and the step's multiply-adds by hand."""

import json

import pytest

from archscan.cli import main

MODELS = '''
import transformers


def t5():
    return transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4))


def whisper():
    return transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(
        vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=50, max_target_positions=64, pad_token_id=0, bos_token_id=1, eos_token_id=2,
        decoder_start_token_id=1))
'''


@pytest.fixture
def models(tmp_path):
    pytest.importorskip("transformers")
    path = tmp_path / "seq2seq.py"
    path.write_text(MODELS)
    return str(path)


def _decode(capsys, target, *inputs, context=16) -> dict:
    args = [target, *[a for i in inputs for a in ("--input", i)], "--decode", str(context), "--json"]
    assert main(args) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_t5_step_after_its_encoder(capsys, models):
    layers, d, heads, dk, ff, vocab, source, context, batch = 2, 64, 4, 16, 128, 128, 24, 16, 2
    report = _decode(capsys, f"{models}:t5", f"{batch},{source}:int64", f"decoder_input_ids={batch},1:int64")
    kv = report["kv_cache"]
    assert kv["bytes_per_token"] == layers * 2 * heads * dk * 4                        # self-attention keys and values
    assert kv["fixed_bytes_per_sequence"] == layers * 2 * heads * dk * source * 4      # cross-attention: the encoder's
    assert kv["bytes"] == batch * (context * kv["bytes_per_token"] + kv["fixed_bytes_per_sequence"])
    per_token = layers * (4 * d * heads * dk      # self-attention q, k, v, o
                          + 2 * d * heads * dk    # cross-attention q, o (its k and v are cached)
                          + 2 * d * ff            # the feed-forward
                          + 2 * heads * (context + 1) * dk + 2 * heads * source * dk) + d * vocab
    assert report["phases"]["decode"]["flops"] == batch * per_token  # no encoder in the step


def test_whisper_cross_attends_to_its_audio_frames(capsys, models):
    layers, d, frames = 2, 64, 50  # 100 mel frames, strided to 50
    report = _decode(capsys, f"{models}:whisper", "1,16,100", "decoder_input_ids=1,1:int64")
    assert report["kv_cache"]["bytes_per_token"] == layers * 2 * d * 4
    assert report["kv_cache"]["fixed_bytes_per_sequence"] == layers * 2 * d * frames * 4


@pytest.mark.parametrize("inputs, needle", [
    (["2,24:int64", "2,1:int64"], "decoder_input_ids=[batch, new tokens]"),
    (["2,24:int64", "decoder_input_ids=1,1:int64"], "the same batch"),
])
def test_bad_encoder_decoder_decodes_are_one_line(capsys, models, inputs, needle):
    code = main([f"{models}:t5", *[a for i in inputs for a in ("--input", i)], "--decode", "16"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and needle in err[0], err
