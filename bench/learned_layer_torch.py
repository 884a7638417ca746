"""An independent check of awq_learned_layer's method, in PyTorch (autograd, not nibble's reverse pass):
AutoRound's sign steps on each decoder layer's whole output, written for the ONNX Runtime GenAI builder's
Llama form (SmolLM2: packed q/k/v, GroupQueryAttention with rotary halves, SkipSimplifiedLayerNormalization,
SiLU MLP; the block's float forward equals ONNX Runtime's logits within 1.4e-6 relative RMS).

It starts from a nibble `--algo awq_gptq --format dq` output of the same model: the AWQ scales are read back
from the folded norms and the pre-quant Muls, the block scales are awq_gptq's, and the codes restart from
round-to-nearest (`--start rtn`; `--start gptq` keeps GPTQ's, from which steps of 1 / iters rarely move a
code). Each layer learns on the learned layers' outputs (`--input quantized`, AutoRound's default) or the
float model's (`--input float`), against the float layer on the float activations. It writes a dq model
with the learned codes and scales, for tools/eval_ppl.py.

Not a dependency of nibble: PyTorch in a separate virtual environment (pip install torch numpy onnx).

    python bench/learned_layer_torch.py FLOAT_DIR AWQ_GPTQ_DQ_DIR OUT_DIR calib.npz \
        --iters 200 --batch 4 --start rtn --learn_scale [--input float] [--layers N] [--threads 2]
"""
import argparse, os, shutil, time, json
import numpy as np
import onnx
from onnx import numpy_helper
import torch

ap = argparse.ArgumentParser()
ap.add_argument("float_dir"); ap.add_argument("gptq_dir"); ap.add_argument("out_dir"); ap.add_argument("calib")
ap.add_argument("--iters", type=int, default=100)
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--lr", type=float, default=None)
ap.add_argument("--start", default="gptq")
ap.add_argument("--learn_scale", action="store_true")
ap.add_argument("--vbound", type=float, default=0.5)
ap.add_argument("--layers", type=int, default=999)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--samples", type=int, default=0)
ap.add_argument("--input", default="quantized")
args = ap.parse_args()
torch.set_num_threads(args.threads)
torch.manual_seed(0)
lr = args.lr if args.lr is not None else 1.0 / args.iters

fm = onnx.load(os.path.join(args.float_dir, "model.onnx"))
qm = onnx.load(os.path.join(args.gptq_dir, "model.onnx"))
F = {i.name: i for i in fm.graph.initializer}
Q = {i.name: i for i in qm.graph.initializer}
def arr(d, n): return numpy_helper.to_array(d[n])
def tf(a): return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32))

# attributes
gqa = next(n for n in fm.graph.node if n.op_type == "GroupQueryAttention")
at = {a.name: onnx.helper.get_attribute_value(a) for a in gqa.attribute}
NH, KVH, SCALE = at["num_heads"], at["kv_num_heads"], at["scale"]
cos = tf(arr(F, "cos_cache")); sin = tf(arr(F, "sin_cache"))
HD = cos.shape[1] * 2
EPS = 1e-5
nlayers = sum(1 for n in F if n.endswith("input_layernorm.weight"))
ROLES = ["attn.qkv_proj", "attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]

def rms(x, g):
    v = (x.double() ** 2).mean(-1, keepdim=True)
    return (x / torch.sqrt(v + EPS).float()) * g

def rope(x):  # x [B, H, L, HD], halves rotation
    L = x.shape[2]
    c, s = cos[:L], sin[:L]
    x1, x2 = x[..., :HD // 2], x[..., HD // 2:]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c], -1)

def block(x, W, g1, g2, pre_o, pre_d):
    B, L, D = x.shape
    h = rms(x, g1)
    qkv = h @ W["attn.qkv_proj"]
    q, k, v = qkv.split([NH * HD, KVH * HD, KVH * HD], -1)
    q = rope(q.view(B, L, NH, HD).transpose(1, 2))
    k = rope(k.view(B, L, KVH, HD).transpose(1, 2))
    v = v.view(B, L, KVH, HD).transpose(1, 2)
    rep = NH // KVH
    k = k.repeat_interleave(rep, 1); v = v.repeat_interleave(rep, 1)
    s = (q @ k.transpose(-1, -2)) * SCALE
    mask = torch.ones(L, L, dtype=torch.bool).triu(1)
    s = s.masked_fill(mask, float("-inf"))
    a = torch.softmax(s, -1) @ v
    a = a.transpose(1, 2).reshape(B, L, NH * HD)
    if pre_o is not None: a = a * pre_o
    x = x + a @ W["attn.o_proj"]
    h = rms(x, g2)
    m = torch.nn.functional.silu(h @ W["mlp.gate_proj"]) * (h @ W["mlp.up_proj"])
    if pre_d is not None: m = m * pre_d
    return x + m @ W["mlp.down_proj"]

def qname(i, r): return f"model.layers.{i}.{r}.MatMul.weight"

def pre_scale(i, where):
    n = f"/model/layers.{i}/{where}_pre_quant_scale"
    return tf(arr(Q, n)).flatten() if n in Q else None

ids = np.load(args.calib)["input_ids"]
if args.samples: ids = ids[:args.samples]
emb = tf(arr(F, "model.embed_tokens.weight"))
xf = emb[torch.from_numpy(ids.astype(np.int64))]
xq = xf.clone()
N = xf.shape[0]
log = []
t0 = time.time()
for i in range(min(nlayers, args.layers)):
    Wf = {r: tf(arr(F, qname(i, r))) for r in ROLES}
    g1f, g2f = tf(arr(F, f"model.layers.{i}.input_layernorm.weight")), tf(arr(F, f"model.layers.{i}.post_attention_layernorm.weight"))
    g1q, g2q = tf(arr(Q, f"model.layers.{i}.input_layernorm.weight")), tf(arr(Q, f"model.layers.{i}.post_attention_layernorm.weight"))
    po, pd = pre_scale(i, "attn/GroupQueryAttention/output_0"), pre_scale(i, "mlp/Mul/output_0")
    # W' (the weight GPTQ quantized) in the quantized model's coordinates
    in_scale = {"attn.qkv_proj": g1f / g1q, "attn.o_proj": 1.0 / po, "mlp.gate_proj": g2f / g2q,
                "mlp.up_proj": g2f / g2q, "mlp.down_proj": 1.0 / pd}
    P = {}
    for r in ROLES:
        Wp = Wf[r] * in_scale[r][:, None]
        codes = tf(arr(Q, qname(i, r) + "_i4"))
        sc = tf(arr(Q, qname(i, r) + "_scale"))
        K = Wp.shape[0]
        blk = 128
        scf = sc.repeat_interleave(blk, 0)[:K]
        u = Wp / scf
        v0 = (codes - u) if args.start == "gptq" else torch.zeros_like(u)
        P[r] = dict(Wp=Wp, sc=sc, u=u, v0=v0, v=v0.clone().requires_grad_(True),
                    ls=torch.zeros_like(sc).requires_grad_(args.learn_scale), K=K)
    def qweights(P, hard=False):
        W = {}
        for r, p in P.items():
            scl = p["sc"] * (1 + p["ls"])
            scf = scl.repeat_interleave(128, 0)[:p["K"]]
            x = p["Wp"] / scf + p["v"]
            qv = torch.clamp(x + (torch.round(x) - x).detach(), -8, 7)
            W[r] = qv * scf
        return W
    with torch.no_grad():
        yf = torch.cat([block(xf[b:b + 8], Wf, g1f, g2f, None, None) for b in range(0, N, 8)])
        def full_loss(P):
            W = qweights(P)
            return sum(((block((xq if args.input == 'quantized' else xf)[b:b + 8], W, g1q, g2q, po, pd) - yf[b:b + 8]) ** 2).sum().item() for b in range(0, N, 8)) / yf.numel()
        l_start = full_loss(P)
    params = [p["v"] for p in P.values()] + ([p["ls"] for p in P.values()] if args.learn_scale else [])
    best, best_state = float("inf"), None
    g = torch.Generator().manual_seed(i)
    for t in range(args.iters):
        step = lr * (1 - t / args.iters)
        idx = torch.randperm(N, generator=g)[:args.batch]
        W = qweights(P)
        loss = ((block((xq if args.input == 'quantized' else xf)[idx], W, g1q, g2q, po, pd) - yf[idx]) ** 2).mean()
        for p in params: p.grad = None
        loss.backward()
        if loss.item() < best:
            best = loss.item()
            best_state = {r: (p["v"].detach().clone(), p["ls"].detach().clone()) for r, p in P.items()}
        with torch.no_grad():
            for r, p in P.items():
                p["v"] -= step * torch.sign(p["v"].grad)
                lo = torch.minimum(p["v0"], torch.zeros_like(p["v0"])) - args.vbound
                hi = torch.maximum(p["v0"], torch.zeros_like(p["v0"])) + args.vbound
                p["v"].copy_(torch.maximum(torch.minimum(p["v"], hi), lo))
                if args.learn_scale:
                    p["ls"] -= step * torch.sign(p["ls"].grad)
                    p["ls"].clamp_(-0.2, 0.2)
    with torch.no_grad():
        if best_state is not None:
            for r, (v, ls) in best_state.items():
                P[r]["v"].copy_(v); P[r]["ls"].copy_(ls)
        l_end = full_loss(P)
        if l_end > l_start:  # keep GPTQ's if learning made the full-data loss worse
            for r, p in P.items():
                p["v"].copy_(p["v0"]); p["ls"].zero_()
        W = qweights(P)
        moved = 0
        for r, p in P.items():
            scl = p["sc"] * (1 + p["ls"])
            scf = scl.repeat_interleave(128, 0)[:p["K"]]
            codes = torch.clamp(torch.round(p["Wp"] / scf + p["v"]), -8, 7).to(torch.int8).numpy()
            old = arr(Q, qname(i, r) + "_i4")
            moved += int((codes != old).sum())
            t_ = onnx.helper.make_tensor(qname(i, r) + "_i4", onnx.TensorProto.INT4, codes.shape, codes.flatten().tolist())
            Q[qname(i, r) + "_i4"].CopyFrom(t_)
            Q[qname(i, r) + "_scale"].CopyFrom(numpy_helper.from_array(scl.numpy().astype(np.float32), qname(i, r) + "_scale"))
        xq = torch.cat([block(xq[b:b + 8], W, g1q, g2q, po, pd) for b in range(0, N, 8)])
        xf = yf
    rec = dict(layer=i, start=l_start, end=min(l_end, l_start), moved=moved, secs=round(time.time() - t0, 1))
    log.append(rec); print(json.dumps(rec), flush=True)

os.makedirs(args.out_dir, exist_ok=True)
onnx.save(qm, os.path.join(args.out_dir, "model.onnx"), save_as_external_data=True, location="model.onnx.data")
for f in os.listdir(args.gptq_dir):
    if not f.startswith("model.onnx"): shutil.copy(os.path.join(args.gptq_dir, f), args.out_dir)
print("done", time.time() - t0)
