# The engine's data, in llama2.c run.c's shape: Config (shapes, never change), TransformerWeights
# (read-only pointers into the mapped file, each with its shape), RunState (the buffers forward
# overwrites), plus the observer that a forward reports its stages to (observer.pxd). core.pyx fills
# them once, when a model is bound to a plugin; forward.pyx and generate.pyx only read Config and
# TransformerWeights and write RunState.

from pyllama.engine.observer cimport Observer
from pyllama.kernels.matvec cimport Matrix, QuantScratch
from pyllama.kernels.rope cimport RopeSpec
from pyllama.kernels.threads cimport DecodeTeam

# where a forward first saw NaN or Inf (RunState.nonfinite_stage; NonFiniteError.at describes each)
cdef enum:
    NONFINITE_EMBEDDING = 0
    NONFINITE_QKV = 1
    NONFINITE_ATTENTION = 2
    NONFINITE_WO = 3
    NONFINITE_FFN = 4
    NONFINITE_LOGITS = 5

cdef struct Config:
    int dim                    # residual stream width
    int hidden_dim             # FFN width
    int n_layers
    int n_heads                # query heads
    int n_kv_heads             # key/value heads (grouped-query attention when < n_heads)
    int head_dim
    int q_dim                  # n_heads * head_dim
    int kv_dim                 # n_kv_heads * head_dim
    int vocab_size
    float eps                  # rmsnorm epsilon
    int arithmetic             # whose rmsnorm/SwiGLU rounding: ARITH_RUNC or ARITH_GGML (kernels/elementwise.pxd)
    int max_block              # most positions one pass takes
    long long position_work    # ModelConfig.position_work: multiply-adds of one position
    int ffn_activation         # FFN_SILU (SwiGLU) or FFN_GELU_TANH (GeGLU, Gemma 3)
    float embedding_scale      # the embedding row times this (1: none; Gemma 3: sqrtf(dim))
    float logit_softcap        # logits = c * tanh(logits / c) when c > 0

cdef struct LayerPtrs:
    const float* attn_norm     # [dim]
    const float* ffn_norm      # [dim]
    const float* bq            # [q_dim] or NULL (qwen2's Q/K/V biases)
    const float* bk            # [kv_dim] or NULL
    const float* bv            # [kv_dim] or NULL
    const float* q_norm        # [head_dim] or NULL: RMSNorm of every query head before RoPE (qwen3, gemma3)
    const float* k_norm        # [head_dim] or NULL: the same for keys
    const float* post_attn_norm  # [dim] or NULL: RMSNorm of Wo's output before the residual add (gemma3)
    const float* post_ffn_norm   # [dim] or NULL: RMSNorm of the FFN's output before its residual add
    int rope                   # which of RunState.ropes rotates this layer's queries and keys
    Matrix wq                  # (q_dim, dim)
    Matrix wk                  # (kv_dim, dim)
    Matrix wv                  # (kv_dim, dim)
    Matrix wo                  # (dim, q_dim)
    Matrix w1                  # gate (hidden_dim, dim)
    Matrix w2                  # down (dim, hidden_dim)
    Matrix w3                  # up (hidden_dim, dim)

cdef struct TransformerWeights:
    Matrix tok_emb             # (vocab_size, dim)
    Matrix cls                 # (vocab_size, dim): the embedding itself when shared
    const float* final_norm    # [dim]
    LayerPtrs* layers          # [n_layers]

cdef struct RopeTables:
    RopeSpec spec
    long long rows             # positions precomputed; later ones are computed into scratch
    float* cos                 # [rows, n_rot / 2]
    float* sin                 # [rows, n_rot / 2]
    float* scratch             # [2, n_rot / 2]: cos and sin of a position past the table

cdef struct RunState:
    # run.c's names, each [max_block, width]: row i is position pos + i of the pass (decode: row 0)
    float* x                   # dim: the residual stream
    float* xb                  # dim: the normed input of a product, then the FFN's output
    float* xb2                 # dim: the attention block's output (Wo)
    float* hb                  # hidden_dim: w1 x, then silu(w1 x) * w3 x
    float* hb2                 # hidden_dim: w3 x
    float* q                   # q_dim
    float* k                   # kv_dim
    float* v                   # kv_dim
    float* att                 # q_dim: the plugin's attention output
    float* q_pre               # q_dim, or NULL: the queries before RoPE, for a plugin that asks for them
    float* logits              # [vocab_size]: the last row's logits (a pass without a logits buffer)
    QuantScratch qscratch      # the integer kernels' quantised activations, max_block rows
    RopeTables* ropes          # [n_ropes]: one per distinct RoPE base of the layers
    int n_ropes
    # non-finite detection (nonfinite.pyx)
    int nonfinite_layer        # -1, or the first layer whose output held NaN/Inf (last pass: its earliest bad row)
    int nonfinite_stage        # NONFINITE_*: what of that layer went bad first
    long long nonfinite_position  # the position of that row
    int* row_bad               # [max_block]: each row's first non-finite layer, -1: none
    int* row_stage             # [max_block]: NONFINITE_* of that row

cdef struct Transformer:
    Config config
    TransformerWeights weights
    RunState state
    Observer observer          # what a pass reports its stages to (observer.pxd); stage NULL: nobody
    int n_threads
    bint per_position          # the plugin's per_position_order: passes of one row each
    DecodeTeam blocks          # picks 1 or n_threads per layer of a block from their times (threads.pyx)
    bint layer_units           # inside forward_block: each layer is one of t.blocks' timed units
