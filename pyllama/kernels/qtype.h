/* What a row of the weight-type table (qtypes.h) holds, and the C view of the data its kernels take.
 *
 * A weight type is one row: its facts (ggml's name and GGUF id, values and bytes per block, what the
 * activation is quantised to before the row products) and its kernels, compiled for the build's SIMD
 * path. A product of a matrix is a number of units (rows, groups of rows, strips: the type says); the
 * product loop (qproduct.pyx) splits the units over threads and calls the type's kernel on each thread's
 * range, so that every element is computed by one kernel call whatever the split. Nothing routes on the
 * order of the ids: the loop reads the row's fields.
 */
#ifndef PYLLAMA_QTYPE_H
#define PYLLAMA_QTYPE_H

#include <stddef.h>
#include <stdint.h>

/* The ids of the types: the index of a type's row, QType's value in Python. Their order means nothing. */
enum {
    PYLLAMA_F32,
    PYLLAMA_F16,
    PYLLAMA_BF16,
    PYLLAMA_Q8_0,
    PYLLAMA_Q4_0,
    PYLLAMA_Q4_1,
    PYLLAMA_Q5_0,
    PYLLAMA_Q5_1,
    PYLLAMA_IQ4_NL,
    PYLLAMA_Q2_K,
    PYLLAMA_Q3_K,
    PYLLAMA_Q4_K,
    PYLLAMA_Q5_K,
    PYLLAMA_Q6_K,
    PYLLAMA_Q8_GROUPS, /* llama2.c's version-2 checkpoints (not a GGUF type) */
    PYLLAMA_N_QTYPES
};

/* What x is quantised to before the row products (llama.cpp's vec_dot_type): the index of the
   activation's row in pyllama_acts (qtypes.h). Matrices of one activation share one quantised x. */
enum {
    PYLLAMA_ACT_F32,       /* kept as float32 (F32, F16, BF16) */
    PYLLAMA_ACT_Q8_0,      /* 32 int8 and an fp16 scale per block */
    PYLLAMA_ACT_Q8_0_TILE, /* Q8_0, with a whole tile of four positions also laid out for Q8_0's block tiles */
    PYLLAMA_ACT_Q8_1,      /* Q8_0 plus s = d * sum(q) per block */
    PYLLAMA_ACT_Q8_K,      /* 256 int8, a float32 scale and the sums of each 16 */
    PYLLAMA_ACT_Q8_GROUPS, /* llama2.c's runq.c: int8 and a float32 scale per group of the matrix's size */
    PYLLAMA_N_ACTS
};

/* A weight matrix: rows outputs by cols inputs, as stored (matvec.pxd's Matrix, without its type). */
typedef struct {
    const void* data;    /* the blocks as the file stores them */
    const void* packed;  /* the packed copy (qpacked.h), or NULL: the products read data */
    const float* scales; /* Q8_GROUPS: one float32 per group of each row */
    int group_size;      /* Q8_GROUPS */
    ptrdiff_t rows;
    ptrdiff_t cols;
} pyllama_matrix;

/* The quantised activation of one position, as the row kernels read it. */
typedef struct {
    const int8_t* q;      /* int8[cols] */
    const float* d;       /* the scale of each block (Q8_0/Q8_1: per 32, the fp16 value; Q8_K: per 256; groups) */
    const float* s;       /* Q8_1: fp16(d * sum(q)) per 32, as float32 */
    const int16_t* bsums; /* Q8_K: the sum of each 16 q */
    const int32_t* o4;    /* Q8_0: -16 times the sum of each 4 q (packed Q5_0's lane offsets) */
    const int32_t* o32;   /* Q8_0: -8 times the sum of each 32 q (packed Q4_0's block offsets) */
    const float* x;       /* the float32 activation itself */
} pyllama_qact;

/* The activations of n_pos positions in a QuantScratch's buffers: position p's int8 values at
   q + p * cols, its scales at d + p * d_stride, its Q8_1 sums at s + p * (cols / 32), its Q8_K sums at
   bsums + p * (cols / 16), its Q8_0 offsets o4 and o32 at isums + p * (cols / 4 + cols / 32); x holds the
   float32 positions. A tile of four positions of Q8_0's own product also has its scales side by side after
   all the positions' (d + n_pos * d_stride). */
typedef struct {
    int8_t* q;
    float* d;
    float* s;
    int16_t* bsums;
    int32_t* isums;
    const float* x;
    ptrdiff_t cols;
    ptrdiff_t n_pos;
    ptrdiff_t d_stride;
    int group_size; /* Q8_GROUPS: the values per scale */
} pyllama_acts;

static inline pyllama_qact pyllama_act_at(const pyllama_acts* a, ptrdiff_t p) {
    pyllama_qact one;
    one.q = a->q + p * a->cols;
    one.d = a->d + p * a->d_stride;
    one.s = a->s + p * (a->cols / 32);
    one.bsums = a->bsums + p * (a->cols / 16);
    one.o4 = a->isums ? a->isums + p * (a->cols / 4 + a->cols / 32) : NULL;
    one.o32 = a->isums ? one.o4 + a->cols / 4 : NULL;
    one.x = a->x + p * a->cols;
    return one;
}

/* One activation type: its name (what Python calls it) and how one position is quantised. */
typedef struct {
    const char* name;
    void (*quantise)(const pyllama_acts* a, ptrdiff_t p); /* position p; positions are independent */
} pyllama_act;

/* The units of a product at n_pos positions (n_pos == 1: the single-vector product). */
typedef ptrdiff_t (*pyllama_units_fn)(const pyllama_matrix* m, ptrdiff_t n_pos);
/* Units u0 .. u1 - 1 of the product at a->n_pos positions: out[p * m->rows + r] = W[r] . x[p]. */
typedef void (*pyllama_product_fn)(const pyllama_matrix* m, ptrdiff_t u0, ptrdiff_t u1, const pyllama_acts* a,
                                   float* out);
/* Row r as float32 into out[cols] (the token embedding lookup). */
typedef void (*pyllama_dequantize_fn)(const pyllama_matrix* m, ptrdiff_t r, float* out);
/* The bytes of a rows x cols matrix's packed copy (qpacked.h), 0 when such a matrix is multiplied from
   the file's own layout. */
typedef ptrdiff_t (*pyllama_packed_bytes_fn)(ptrdiff_t rows, ptrdiff_t cols);
/* Groups g0 .. g1 - 1 of 16 rows of m (m->data) into out, the whole packed copy. */
typedef void (*pyllama_pack_fn)(const pyllama_matrix* m, ptrdiff_t g0, ptrdiff_t g1, uint8_t* out);

/* A weight type: one row of the table. */
typedef struct {
    const char* name;   /* ggml's name of the type; QType's member */
    int ggml;           /* its GGUF type id (ggml_type); -1 for a type GGUF does not have */
    int block;          /* values per block */
    int block_bytes;    /* bytes per block */
    int act;            /* PYLLAMA_ACT_*: what the activation is quantised to */
    int work_div;       /* weights per float32 multiply-add of work (threads.pyx's team_size counts those) */
    pyllama_units_fn units;
    pyllama_product_fn vec;  /* the single-vector product (one position), over a range of units */
    pyllama_product_fn mat;  /* the block product (several positions), over a range of units */
    pyllama_dequantize_fn dequantize_row;
    /* a type with a packed layout: its size and its packer (NULL: none; the products then never see a
       packed copy). units, vec and mat take the packed copy when m->packed is set, and give its bits
       either way. */
    pyllama_packed_bytes_fn packed_bytes;
    pyllama_pack_fn pack;
} pyllama_qtype;

#endif /* PYLLAMA_QTYPE_H */
