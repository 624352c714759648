;; The heavy work behind gpt2.ts, in WebAssembly SIMD (f32x4): the matrix products behind
;; matmul, matmulT and unembed, and the elementwise softmax and GELU. kernel.wasm is this file
;; assembled (the grader's tools/kernel/build.mjs), and kernel-fma.wasm is it with the tile's
;; multiply-adds fused (relaxed SIMD); kernel.ts runs the second where Node validates it.
;;
;; Every pointer and stride is in bytes, into the one shared memory. Each product function
;; computes a range of output columns [j0, j1), so several threads can share one product, each
;; taking other columns; every output value is summed in the same order whichever thread
;; computes it.

(module
  (import "env" "memory" (memory 1 65536 shared))

  ;; Pack a kc x nc block of W into panels of 8 columns, zero-padded past nc: panel p holds,
  ;; for k = 0..kc-1, W(k, 8p..8p+7). W(k, j) is at w + k*sk + j*sj.
  (func $pack (param $w i32) (param $sk i32) (param $sj i32) (param $kc i32) (param $nc i32)
              (param $dst i32)
    (local $j i32) (local $k i32) (local $src i32) (local $c i32)
    (local.set $j (i32.const 0))
    (block $done (loop $panels
      (br_if $done (i32.ge_u (local.get $j) (local.get $nc)))
      (local.set $k (i32.const 0))
      (loop $rows
        (local.set $src (i32.add (local.get $w) (i32.add (i32.mul (local.get $k) (local.get $sk))
                                                         (i32.mul (local.get $j) (local.get $sj)))))
        (if (i32.and (i32.eq (local.get $sj) (i32.const 4))
                     (i32.le_u (i32.add (local.get $j) (i32.const 8)) (local.get $nc)))
          (then  ;; 8 contiguous values: two vector copies
            (v128.store (local.get $dst) (v128.load (local.get $src)))
            (v128.store offset=16 (local.get $dst) (v128.load offset=16 (local.get $src))))
          (else  ;; strided or past the edge: one value at a time, zeros beyond nc
            (local.set $c (i32.const 0))
            (loop $cols
              (f32.store (i32.add (local.get $dst) (i32.shl (local.get $c) (i32.const 2)))
                (if (result f32) (i32.lt_u (i32.add (local.get $j) (local.get $c)) (local.get $nc))
                  (then (f32.load (i32.add (local.get $src) (i32.mul (local.get $c) (local.get $sj)))))
                  (else (f32.const 0))))
              (local.set $c (i32.add (local.get $c) (i32.const 1)))
              (br_if $cols (i32.lt_u (local.get $c) (i32.const 8))))))
        (local.set $dst (i32.add (local.get $dst) (i32.const 32)))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br_if $rows (i32.lt_u (local.get $k) (local.get $kc))))
      (local.set $j (i32.add (local.get $j) (i32.const 8)))
      (br $panels))))

  ;; X's rows in panels of 4, interleaved: panel q holds, for k = 0..d-1, X(4q..4q+3, k), so a
  ;; tile reads its four rows' k-th values as one 16-byte step. Rows past n are zeros. Whole
  ;; panels go four columns at a time (a 4 x 4 transpose in registers), the edges one value at
  ;; a time.
  (func (export "packx") (param $x i32) (param $ldx i32) (param $n i32) (param $d i32)
        (param $dst i32)
    (local $i i32) (local $k i32) (local $full i32) (local $d4 i32) (local $o i32)
    (local $r0 i32) (local $r1 i32) (local $r2 i32) (local $r3 i32)
    (local $v0 v128) (local $v1 v128) (local $v2 v128) (local $v3 v128)
    (local $t0 v128) (local $t1 v128) (local $t2 v128) (local $t3 v128)
    (local.set $full (i32.and (local.get $n) (i32.const -4)))
    (local.set $d4 (i32.and (local.get $d) (i32.const -4)))
    (local.set $i (i32.const 0))
    (block $done (loop $panels
      (br_if $done (i32.ge_u (local.get $i) (local.get $full)))
      (local.set $r0 (i32.add (local.get $x) (i32.mul (local.get $i) (local.get $ldx))))
      (local.set $r1 (i32.add (local.get $r0) (local.get $ldx)))
      (local.set $r2 (i32.add (local.get $r1) (local.get $ldx)))
      (local.set $r3 (i32.add (local.get $r2) (local.get $ldx)))
      (local.set $o (i32.add (local.get $dst) (i32.mul (local.get $i) (i32.shl (local.get $d) (i32.const 2)))))
      (local.set $k (i32.const 0))
      (block $kdone (loop $cols
        (br_if $kdone (i32.ge_u (local.get $k) (local.get $d4)))
        (local.set $v0 (v128.load (i32.add (local.get $r0) (i32.shl (local.get $k) (i32.const 2)))))
        (local.set $v1 (v128.load (i32.add (local.get $r1) (i32.shl (local.get $k) (i32.const 2)))))
        (local.set $v2 (v128.load (i32.add (local.get $r2) (i32.shl (local.get $k) (i32.const 2)))))
        (local.set $v3 (v128.load (i32.add (local.get $r3) (i32.shl (local.get $k) (i32.const 2)))))
        ;; t0 = (v0[0], v1[0], v0[1], v1[1]), t2 = (v0[2], v1[2], v0[3], v1[3]); t1, t3 of v2, v3
        (local.set $t0 (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $v0) (local.get $v1)))
        (local.set $t1 (i8x16.shuffle 0 1 2 3 16 17 18 19 4 5 6 7 20 21 22 23 (local.get $v2) (local.get $v3)))
        (local.set $t2 (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $v0) (local.get $v1)))
        (local.set $t3 (i8x16.shuffle 8 9 10 11 24 25 26 27 12 13 14 15 28 29 30 31 (local.get $v2) (local.get $v3)))
        (v128.store (local.get $o) (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $t0) (local.get $t1)))
        (v128.store offset=16 (local.get $o) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $t0) (local.get $t1)))
        (v128.store offset=32 (local.get $o) (i8x16.shuffle 0 1 2 3 4 5 6 7 16 17 18 19 20 21 22 23 (local.get $t2) (local.get $t3)))
        (v128.store offset=48 (local.get $o) (i8x16.shuffle 8 9 10 11 12 13 14 15 24 25 26 27 28 29 30 31 (local.get $t2) (local.get $t3)))
        (local.set $o (i32.add (local.get $o) (i32.const 64)))
        (local.set $k (i32.add (local.get $k) (i32.const 4)))
        (br $cols)))
      (call $packcells (local.get $x) (local.get $ldx) (local.get $n) (local.get $d) (local.get $dst)
                       (local.get $i) (i32.add (local.get $i) (i32.const 4)) (local.get $d4))
      (local.set $i (i32.add (local.get $i) (i32.const 4)))
      (br $panels)))
    (call $packcells (local.get $x) (local.get $ldx) (local.get $n) (local.get $d) (local.get $dst)
                     (local.get $full) (i32.and (i32.add (local.get $n) (i32.const 3)) (i32.const -4))
                     (i32.const 0)))

  ;; packx one value at a time: rows i0..i1-1, columns k0..d-1 (zeros for rows past n)
  (func $packcells (param $x i32) (param $ldx i32) (param $n i32) (param $d i32) (param $dst i32)
                   (param $i0 i32) (param $i1 i32) (param $k0 i32)
    (local $i i32) (local $k i32) (local $src i32)
    (local.set $i (local.get $i0))
    (block $done (loop $rows  ;; row i goes to lane i % 4 of panel i / 4
      (br_if $done (i32.ge_u (local.get $i) (local.get $i1)))
      (local.set $src (i32.add (local.get $x) (i32.mul (local.get $i) (local.get $ldx))))
      (local.set $k (local.get $k0))
      (block $kdone (loop $cols
        (br_if $kdone (i32.ge_u (local.get $k) (local.get $d)))
        (f32.store (i32.add (i32.add (local.get $dst)
                                     (i32.mul (i32.shr_u (local.get $i) (i32.const 2))
                                              (i32.shl (local.get $d) (i32.const 4))))
                            (i32.add (i32.shl (local.get $k) (i32.const 4))
                                     (i32.shl (i32.and (local.get $i) (i32.const 3)) (i32.const 2))))
          (if (result f32) (i32.lt_u (local.get $i) (local.get $n))
            (then (f32.load (i32.add (local.get $src) (i32.shl (local.get $k) (i32.const 2)))))
            (else (f32.const 0))))
        (local.set $k (i32.add (local.get $k) (i32.const 1)))
        (br $cols)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $rows))))

  ;; C[4, 8] += X[4, kc] @ P[kc, 8]: X one packed panel (16 bytes a k), P one packed panel of W
  ;; (32 bytes a k), C rows ldc apart. Eight accumulators, two W vectors and one broadcast: 11
  ;; of the 16 SIMD registers, so nothing spills; two pointers to step. (Two k a step, or a
  ;; call after the loop, has the compiler keep accumulators on the stack: measured slower.)
  ;; kernel-fma.wasm is this file with the eight `a += b * w` below fused into relaxed SIMD's
  ;; f32x4.relaxed_madd (tools/kernel/build.mjs rewrites exactly these eight).
  (func $tile4x8 (param $x i32) (param $p i32) (param $kc i32) (param $c i32) (param $ldc i32)
    (local $end i32) (local $w0 v128) (local $w1 v128) (local $b v128)
    (local $a00 v128) (local $a01 v128) (local $a10 v128) (local $a11 v128)
    (local $a20 v128) (local $a21 v128) (local $a30 v128) (local $a31 v128)
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $kc) (i32.const 5))))
    (loop $k
      (local.set $w0 (v128.load (local.get $p)))
      (local.set $w1 (v128.load offset=16 (local.get $p)))
      (local.set $b (v128.load32_splat (local.get $x)))
      (local.set $a00 (f32x4.add (local.get $a00) (f32x4.mul (local.get $b) (local.get $w0))))
      (local.set $a01 (f32x4.add (local.get $a01) (f32x4.mul (local.get $b) (local.get $w1))))
      (local.set $b (v128.load32_splat offset=4 (local.get $x)))
      (local.set $a10 (f32x4.add (local.get $a10) (f32x4.mul (local.get $b) (local.get $w0))))
      (local.set $a11 (f32x4.add (local.get $a11) (f32x4.mul (local.get $b) (local.get $w1))))
      (local.set $b (v128.load32_splat offset=8 (local.get $x)))
      (local.set $a20 (f32x4.add (local.get $a20) (f32x4.mul (local.get $b) (local.get $w0))))
      (local.set $a21 (f32x4.add (local.get $a21) (f32x4.mul (local.get $b) (local.get $w1))))
      (local.set $b (v128.load32_splat offset=12 (local.get $x)))
      (local.set $a30 (f32x4.add (local.get $a30) (f32x4.mul (local.get $b) (local.get $w0))))
      (local.set $a31 (f32x4.add (local.get $a31) (f32x4.mul (local.get $b) (local.get $w1))))
      (local.set $x (i32.add (local.get $x) (i32.const 16)))
      (local.set $p (i32.add (local.get $p) (i32.const 32)))
      (br_if $k (i32.lt_u (local.get $p) (local.get $end))))
    ;; C += the sums
    (v128.store (local.get $c) (f32x4.add (v128.load (local.get $c)) (local.get $a00)))
    (v128.store offset=16 (local.get $c) (f32x4.add (v128.load offset=16 (local.get $c)) (local.get $a01)))
    (local.set $c (i32.add (local.get $c) (local.get $ldc)))
    (v128.store (local.get $c) (f32x4.add (v128.load (local.get $c)) (local.get $a10)))
    (v128.store offset=16 (local.get $c) (f32x4.add (v128.load offset=16 (local.get $c)) (local.get $a11)))
    (local.set $c (i32.add (local.get $c) (local.get $ldc)))
    (v128.store (local.get $c) (f32x4.add (v128.load (local.get $c)) (local.get $a20)))
    (v128.store offset=16 (local.get $c) (f32x4.add (v128.load offset=16 (local.get $c)) (local.get $a21)))
    (local.set $c (i32.add (local.get $c) (local.get $ldc)))
    (v128.store (local.get $c) (f32x4.add (v128.load (local.get $c)) (local.get $a30)))
    (v128.store offset=16 (local.get $c) (f32x4.add (v128.load offset=16 (local.get $c)) (local.get $a31))))

  ;; OUT[n, j0..j1] += X[n, d] @ W[d, j0..j1]. X packed by packx (xp), n a multiple of 4 (OUT
  ;; has room for the padding rows). W(k, j) at w + k*sk + j*sj (sj = 4 for W as stored, sk = 4
  ;; for W transposed). OUT rows ldo apart, each with room up to j1 rounded up to 8. Blocks of
  ;; kcmax rows by ncmax columns of W are packed into `pack` (kcmax * (ncmax + 8) floats) so the
  ;; tiles read them in order, from cache.
  (func (export "gemm") (param $xp i32) (param $w i32) (param $sk i32) (param $sj i32)
        (param $out i32) (param $ldo i32) (param $n i32) (param $d i32)
        (param $j0 i32) (param $j1 i32) (param $pack i32) (param $kcmax i32) (param $ncmax i32)
    (local $kb i32) (local $kc i32) (local $jb i32) (local $nc i32) (local $i i32) (local $p i32)
    (local $xrow i32) (local $orow i32) (local $panel i32) (local $step i32)
    (local.set $panel (i32.shl (local.get $d) (i32.const 4)))  ;; bytes per panel of X
    (local.set $step (i32.shl (local.get $ldo) (i32.const 2)))  ;; OUT: four rows
    (local.set $kb (i32.const 0))
    (block $kdone (loop $kblocks
      (br_if $kdone (i32.ge_u (local.get $kb) (local.get $d)))
      (local.set $kc (call $min (local.get $kcmax) (i32.sub (local.get $d) (local.get $kb))))
      (local.set $jb (local.get $j0))
      (block $jdone (loop $jblocks
        (br_if $jdone (i32.ge_u (local.get $jb) (local.get $j1)))
        (local.set $nc (call $min (local.get $ncmax) (i32.sub (local.get $j1) (local.get $jb))))
        (call $pack (i32.add (local.get $w) (i32.add (i32.mul (local.get $kb) (local.get $sk))
                                                     (i32.mul (local.get $jb) (local.get $sj))))
                    (local.get $sk) (local.get $sj) (local.get $kc) (local.get $nc) (local.get $pack))
        (local.set $xrow (i32.add (local.get $xp) (i32.shl (local.get $kb) (i32.const 4))))
        (local.set $orow (i32.add (local.get $out) (i32.shl (local.get $jb) (i32.const 2))))
        (local.set $i (i32.const 0))
        (block $idone (loop $rows
          (br_if $idone (i32.ge_u (local.get $i) (local.get $n)))
          (local.set $p (i32.const 0))
          (block $pdone (loop $panels
            (br_if $pdone (i32.ge_u (local.get $p) (local.get $nc)))
            (call $tile4x8 (local.get $xrow)
              (i32.add (local.get $pack) (i32.mul (local.get $p) (i32.shl (local.get $kc) (i32.const 2))))
              (local.get $kc) (i32.add (local.get $orow) (i32.shl (local.get $p) (i32.const 2)))
              (local.get $ldo))
            (local.set $p (i32.add (local.get $p) (i32.const 8)))
            (br $panels)))
          (local.set $xrow (i32.add (local.get $xrow) (local.get $panel)))
          (local.set $orow (i32.add (local.get $orow) (local.get $step)))
          (local.set $i (i32.add (local.get $i) (i32.const 4)))
          (br $rows)))
        (local.set $jb (i32.add (local.get $jb) (local.get $ncmax)))
        (br $jblocks)))
      (local.set $kb (i32.add (local.get $kb) (local.get $kcmax)))
      (br $kblocks))))

  ;; out[j0..j1] += x[d] @ W[d, j0..j1], W rows ldw apart, d a multiple of 4. Four rows of W at
  ;; a time, each read front to back (a one-row product is bound by reading W from memory).
  (func (export "gemv") (param $x i32) (param $w i32) (param $ldw i32) (param $out i32)
        (param $d i32) (param $j0 i32) (param $j1 i32)
    (local $k i32) (local $o i32) (local $vend i32) (local $end i32)
    (local $r0 i32) (local $r1 i32) (local $r2 i32) (local $r3 i32)
    (local $b0 v128) (local $b1 v128) (local $b2 v128) (local $b3 v128)
    (local.set $end (i32.add (local.get $out) (i32.shl (local.get $j1) (i32.const 2))))
    (local.set $vend (i32.sub (local.get $end) (i32.const 12)))
    (local.set $k (i32.const 0))
    (block $done (loop $rows
      (br_if $done (i32.ge_u (local.get $k) (local.get $d)))
      (local.set $b0 (v128.load32_splat (local.get $x)))
      (local.set $b1 (v128.load32_splat offset=4 (local.get $x)))
      (local.set $b2 (v128.load32_splat offset=8 (local.get $x)))
      (local.set $b3 (v128.load32_splat offset=12 (local.get $x)))
      ;; r0..r3: W(k..k+3, j) for the column j that o is at
      (local.set $r0 (i32.add (i32.add (local.get $w) (i32.mul (local.get $k) (local.get $ldw)))
                              (i32.shl (local.get $j0) (i32.const 2))))
      (local.set $r1 (i32.add (local.get $r0) (local.get $ldw)))
      (local.set $r2 (i32.add (local.get $r1) (local.get $ldw)))
      (local.set $r3 (i32.add (local.get $r2) (local.get $ldw)))
      (local.set $o (i32.add (local.get $out) (i32.shl (local.get $j0) (i32.const 2))))
      (block $vdone (loop $vectors
        (br_if $vdone (i32.ge_u (local.get $o) (local.get $vend)))
        (v128.store (local.get $o) (f32x4.add
          (f32x4.add (v128.load (local.get $o)) (f32x4.mul (local.get $b0) (v128.load (local.get $r0))))
          (f32x4.add (f32x4.mul (local.get $b1) (v128.load (local.get $r1)))
                     (f32x4.add (f32x4.mul (local.get $b2) (v128.load (local.get $r2)))
                                (f32x4.mul (local.get $b3) (v128.load (local.get $r3)))))))
        (local.set $o (i32.add (local.get $o) (i32.const 16)))
        (local.set $r0 (i32.add (local.get $r0) (i32.const 16)))
        (local.set $r1 (i32.add (local.get $r1) (i32.const 16)))
        (local.set $r2 (i32.add (local.get $r2) (i32.const 16)))
        (local.set $r3 (i32.add (local.get $r3) (i32.const 16)))
        (br $vectors)))
      (block $sdone (loop $scalars  ;; the last columns, fewer than 4, in the same order
        (br_if $sdone (i32.ge_u (local.get $o) (local.get $end)))
        (f32.store (local.get $o) (f32.add
          (f32.add (f32.load (local.get $o))
                   (f32.mul (f32x4.extract_lane 0 (local.get $b0)) (f32.load (local.get $r0))))
          (f32.add (f32.mul (f32x4.extract_lane 0 (local.get $b1)) (f32.load (local.get $r1)))
                   (f32.add (f32.mul (f32x4.extract_lane 0 (local.get $b2)) (f32.load (local.get $r2)))
                            (f32.mul (f32x4.extract_lane 0 (local.get $b3)) (f32.load (local.get $r3)))))))
        (local.set $o (i32.add (local.get $o) (i32.const 4)))
        (local.set $r0 (i32.add (local.get $r0) (i32.const 4)))
        (local.set $r1 (i32.add (local.get $r1) (i32.const 4)))
        (local.set $r2 (i32.add (local.get $r2) (i32.const 4)))
        (local.set $r3 (i32.add (local.get $r3) (i32.const 4)))
        (br $scalars)))
      (local.set $x (i32.add (local.get $x) (i32.const 16)))
      (local.set $k (i32.add (local.get $k) (i32.const 4)))
      (br $rows))))

  ;; out[j] += x[d] . W[j, 0..d] for j in j0..j1: the product with W transposed (the tied
  ;; unembedding, h @ wte^T), W rows ldw apart, d a multiple of 4. Four rows of W at a time.
  (func (export "gemvt") (param $x i32) (param $w i32) (param $ldw i32) (param $out i32)
        (param $d i32) (param $j0 i32) (param $j1 i32)
    (local $j i32) (local $k i32) (local $xv v128) (local $bytes i32)
    (local $r0 i32) (local $r1 i32) (local $r2 i32) (local $r3 i32)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local.set $bytes (i32.shl (local.get $d) (i32.const 2)))
    (local.set $j (local.get $j0))
    (block $done (loop $rows
      (br_if $done (i32.ge_u (local.get $j) (local.get $j1)))
      ;; rows j..j+3; past j1 the last block reads row j again (those sums are not stored)
      (local.set $r0 (i32.add (local.get $w) (i32.mul (local.get $j) (local.get $ldw))))
      (local.set $r1 (call $row (local.get $r0) (local.get $ldw) (local.get $j) (i32.const 1) (local.get $j1)))
      (local.set $r2 (call $row (local.get $r0) (local.get $ldw) (local.get $j) (i32.const 2) (local.get $j1)))
      (local.set $r3 (call $row (local.get $r0) (local.get $ldw) (local.get $j) (i32.const 3) (local.get $j1)))
      (local.set $a0 (v128.const f32x4 0 0 0 0))
      (local.set $a1 (v128.const f32x4 0 0 0 0))
      (local.set $a2 (v128.const f32x4 0 0 0 0))
      (local.set $a3 (v128.const f32x4 0 0 0 0))
      (local.set $k (i32.const 0))
      (loop $k4
        (local.set $xv (v128.load (i32.add (local.get $x) (local.get $k))))
        (local.set $a0 (f32x4.add (local.get $a0)
          (f32x4.mul (local.get $xv) (v128.load (i32.add (local.get $r0) (local.get $k))))))
        (local.set $a1 (f32x4.add (local.get $a1)
          (f32x4.mul (local.get $xv) (v128.load (i32.add (local.get $r1) (local.get $k))))))
        (local.set $a2 (f32x4.add (local.get $a2)
          (f32x4.mul (local.get $xv) (v128.load (i32.add (local.get $r2) (local.get $k))))))
        (local.set $a3 (f32x4.add (local.get $a3)
          (f32x4.mul (local.get $xv) (v128.load (i32.add (local.get $r3) (local.get $k))))))
        (local.set $k (i32.add (local.get $k) (i32.const 16)))
        (br_if $k4 (i32.lt_u (local.get $k) (local.get $bytes))))
      (call $store_sum (local.get $out) (local.get $j) (i32.const 0) (local.get $j1) (local.get $a0))
      (call $store_sum (local.get $out) (local.get $j) (i32.const 1) (local.get $j1) (local.get $a1))
      (call $store_sum (local.get $out) (local.get $j) (i32.const 2) (local.get $j1) (local.get $a2))
      (call $store_sum (local.get $out) (local.get $j) (i32.const 3) (local.get $j1) (local.get $a3))
      (local.set $j (i32.add (local.get $j) (i32.const 4)))
      (br $rows))))

  ;; the address of row j + i of W (r is row j's), or row j's when j + i is not before j1
  (func $row (param $r i32) (param $ldw i32) (param $j i32) (param $i i32) (param $j1 i32)
             (result i32)
    (select (i32.add (local.get $r) (i32.mul (local.get $ldw) (local.get $i))) (local.get $r)
            (i32.lt_u (i32.add (local.get $j) (local.get $i)) (local.get $j1))))

  ;; out[j + i] += the four lanes of acc summed, when j + i is before j1
  (func $store_sum (param $out i32) (param $j i32) (param $i i32) (param $j1 i32) (param $acc v128)
    (local $o i32)
    (if (i32.lt_u (i32.add (local.get $j) (local.get $i)) (local.get $j1))
      (then
        (local.set $o (i32.add (local.get $out)
                               (i32.shl (i32.add (local.get $j) (local.get $i)) (i32.const 2))))
        (f32.store (local.get $o) (f32.add (f32.load (local.get $o))
          (f32.add
            (f32.add (f32x4.extract_lane 0 (local.get $acc)) (f32x4.extract_lane 1 (local.get $acc)))
            (f32.add (f32x4.extract_lane 2 (local.get $acc)) (f32x4.extract_lane 3 (local.get $acc)))))))))

  ;; --- the elementwise functions behind gpt2.ts's softmax and gelu -------------------------

  ;; e^x, four lanes at a time, is written out in softmax and gelu below (a call in their loops
  ;; cost more than the rest): to within two float32 ulps, x = n ln2 + r with |r| <= ln2 / 2,
  ;; e^r by a degree-7 polynomial, 2^n put into the exponent bits. Below -87.3 (e^x under
  ;; float32's smallest normal) gives 0, above 88.37 e^88.37 (2.4e38); NaN stays NaN.

  ;; s[0..n] -> softmax(s[0..n]) in place, n a multiple of 4 (pad with -infinity)
  (func (export "softmax") (param $s i32) (param $count i32)
    (local $at i32) (local $end i32) (local $m v128) (local $sum v128) (local $x v128)
    (local $n v128) (local $r v128) (local $y v128) (local $under v128)
    (local $top f32) (local $total f32)
    (local $k0 v128) (local $k1 v128) (local $k2 v128) (local $k3 v128) (local $k4 v128) (local $k5 v128) (local $k6 v128) (local $k7 v128) (local $k8 v128) (local $k9 v128) (local $k10 v128) (local $k11 v128) (local $k12 v128) (local $k13 v128)
    ;; the constants, made once: a v128.const in a loop is rebuilt on every step
    (local.set $k0 (v128.const f32x4 -inf -inf -inf -inf))
    (local.set $k1 (v128.const f32x4 -87.3365 -87.3365 -87.3365 -87.3365))
    (local.set $k2 (v128.const f32x4 88.37626 88.37626 88.37626 88.37626))
    (local.set $k3 (v128.const f32x4 1.442695 1.442695 1.442695 1.442695))
    (local.set $k4 (v128.const f32x4 0.693359375 0.693359375 0.693359375 0.693359375))
    (local.set $k5 (v128.const f32x4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4))
    (local.set $k6 (v128.const f32x4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4))
    (local.set $k7 (v128.const f32x4 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3))
    (local.set $k8 (v128.const f32x4 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3))
    (local.set $k9 (v128.const f32x4 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2))
    (local.set $k10 (v128.const f32x4 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1))
    (local.set $k11 (v128.const f32x4 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1))
    (local.set $k12 (v128.const f32x4 1 1 1 1))
    (local.set $k13 (v128.const i32x4 127 127 127 127))
    (local.set $end (i32.add (local.get $s) (i32.shl (local.get $count) (i32.const 2))))
    (local.set $m (local.get $k0))
    (local.set $at (local.get $s))
    (block $done (loop $max
      (br_if $done (i32.ge_u (local.get $at) (local.get $end)))
      (local.set $m (f32x4.max (local.get $m) (v128.load (local.get $at))))
      (local.set $at (i32.add (local.get $at) (i32.const 16)))
      (br $max)))
    (local.set $top (f32.max (f32.max (f32x4.extract_lane 0 (local.get $m)) (f32x4.extract_lane 1 (local.get $m)))
                             (f32.max (f32x4.extract_lane 2 (local.get $m)) (f32x4.extract_lane 3 (local.get $m)))))
    (local.set $m (f32x4.splat (local.get $top)))
    (local.set $at (local.get $s))
    (block $done (loop $exps
      (br_if $done (i32.ge_u (local.get $at) (local.get $end)))
      (local.set $x (f32x4.sub (v128.load (local.get $at)) (local.get $m)))
      ;; $x = e^$x
      (local.set $under (f32x4.lt (local.get $x) (local.get $k1)))
      (local.set $x (f32x4.min (f32x4.max (local.get $x) (local.get $k1))
                               (local.get $k2)))
      (local.set $n (f32x4.nearest (f32x4.mul (local.get $x)
                                              (local.get $k3))))
      ;; r = x - n ln2, with ln2 in two parts so that n * (its first part) is exact
      (local.set $r (f32x4.sub (f32x4.sub (local.get $x)
                                          (f32x4.mul (local.get $n) (local.get $k4)))
                               (f32x4.mul (local.get $n) (local.get $k5))))
      (local.set $y (local.get $k6))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k7)))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k8)))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k9)))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k10)))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k11)))
      ;; e^r = 1 + r + r^2 * y
      (local.set $y (f32x4.add (f32x4.add (f32x4.mul (local.get $y) (f32x4.mul (local.get $r) (local.get $r)))
                                          (local.get $r))
                               (local.get $k12)))
      ;; times 2^n: n + 127 in the exponent bits
      (local.set $y (f32x4.mul (local.get $y)
        (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $n)) (local.get $k13))
                   (i32.const 23))))
      (local.set $x (v128.andnot (local.get $y) (local.get $under)))
      (v128.store (local.get $at) (local.get $x))
      (local.set $sum (f32x4.add (local.get $sum) (local.get $x)))
      (local.set $at (i32.add (local.get $at) (i32.const 16)))
      (br $exps)))
    (local.set $total (f32.add (f32.add (f32x4.extract_lane 0 (local.get $sum)) (f32x4.extract_lane 1 (local.get $sum)))
                               (f32.add (f32x4.extract_lane 2 (local.get $sum)) (f32x4.extract_lane 3 (local.get $sum)))))
    (local.set $sum (f32x4.splat (local.get $total)))
    (local.set $at (local.get $s))
    (block $done (loop $scale
      (br_if $done (i32.ge_u (local.get $at) (local.get $end)))
      (v128.store (local.get $at) (f32x4.div (v128.load (local.get $at)) (local.get $sum)))
      (local.set $at (i32.add (local.get $at) (i32.const 16)))
      (br $scale))))

  ;; x[0..n] -> GELU(x) in place (the tanh form: 0.5 x (1 + tanh u) = x / (1 + e^(-2u)),
  ;; u = sqrt(2/pi) (x + 0.044715 x^3)), n a multiple of 4
  (func (export "gelu") (param $s i32) (param $count i32)
    (local $at i32) (local $end i32) (local $x v128) (local $u v128) (local $g v128)
    (local $n v128) (local $r v128) (local $y v128) (local $under v128)
    (local $k0 v128) (local $k1 v128) (local $k2 v128) (local $k3 v128) (local $k4 v128) (local $k5 v128) (local $k6 v128) (local $k7 v128) (local $k8 v128) (local $k9 v128) (local $k10 v128) (local $k11 v128) (local $k12 v128) (local $k13 v128) (local $k14 v128)
    ;; the constants, made once: a v128.const in a loop is rebuilt on every step
    (local.set $k0 (v128.const f32x4 -1.5957691 -1.5957691 -1.5957691 -1.5957691))
    (local.set $k1 (v128.const f32x4 1 1 1 1))
    (local.set $k2 (v128.const f32x4 0.044715 0.044715 0.044715 0.044715))
    (local.set $k3 (v128.const f32x4 -87.3365 -87.3365 -87.3365 -87.3365))
    (local.set $k4 (v128.const f32x4 88.37626 88.37626 88.37626 88.37626))
    (local.set $k5 (v128.const f32x4 1.442695 1.442695 1.442695 1.442695))
    (local.set $k6 (v128.const f32x4 0.693359375 0.693359375 0.693359375 0.693359375))
    (local.set $k7 (v128.const f32x4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4 -2.12194440e-4))
    (local.set $k8 (v128.const f32x4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4 1.9875691500e-4))
    (local.set $k9 (v128.const f32x4 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3 1.3981999507e-3))
    (local.set $k10 (v128.const f32x4 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3 8.3334519073e-3))
    (local.set $k11 (v128.const f32x4 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2 4.1665795894e-2))
    (local.set $k12 (v128.const f32x4 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1 1.6666665459e-1))
    (local.set $k13 (v128.const f32x4 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1 5.0000001201e-1))
    (local.set $k14 (v128.const i32x4 127 127 127 127))
    (local.set $end (i32.add (local.get $s) (i32.shl (local.get $count) (i32.const 2))))
    (local.set $at (local.get $s))
    (block $done (loop $values
      (br_if $done (i32.ge_u (local.get $at) (local.get $end)))
      (local.set $x (v128.load (local.get $at)))
      ;; -2u = x * (-2 sqrt(2/pi)) * (1 + 0.044715 x^2)
      (local.set $u (f32x4.mul (f32x4.mul (local.get $x) (local.get $k0))
                               (f32x4.add (local.get $k1)
                                          (f32x4.mul (f32x4.mul (local.get $x) (local.get $x))
                                                     (local.get $k2)))))
      (local.set $g (local.get $x))
      (local.set $x (local.get $u))
      ;; $x = e^$x
      (local.set $under (f32x4.lt (local.get $x) (local.get $k3)))
      (local.set $x (f32x4.min (f32x4.max (local.get $x) (local.get $k3))
                               (local.get $k4)))
      (local.set $n (f32x4.nearest (f32x4.mul (local.get $x)
                                              (local.get $k5))))
      ;; r = x - n ln2, with ln2 in two parts so that n * (its first part) is exact
      (local.set $r (f32x4.sub (f32x4.sub (local.get $x)
                                          (f32x4.mul (local.get $n) (local.get $k6)))
                               (f32x4.mul (local.get $n) (local.get $k7))))
      (local.set $y (local.get $k8))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k9)))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k10)))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k11)))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k12)))
      (local.set $y (f32x4.add (f32x4.mul (local.get $y) (local.get $r))
                               (local.get $k13)))
      ;; e^r = 1 + r + r^2 * y
      (local.set $y (f32x4.add (f32x4.add (f32x4.mul (local.get $y) (f32x4.mul (local.get $r) (local.get $r)))
                                          (local.get $r))
                               (local.get $k1)))
      ;; times 2^n: n + 127 in the exponent bits
      (local.set $y (f32x4.mul (local.get $y)
        (i32x4.shl (i32x4.add (i32x4.trunc_sat_f32x4_s (local.get $n)) (local.get $k14))
                   (i32.const 23))))
      (local.set $x (v128.andnot (local.get $y) (local.get $under)))
      (v128.store (local.get $at)
                  (f32x4.div (local.get $g) (f32x4.add (local.get $k1) (local.get $x))))
      (local.set $at (i32.add (local.get $at) (i32.const 16)))
      (br $values))))

  (func $min (param $a i32) (param $b i32) (result i32)
    (select (local.get $a) (local.get $b) (i32.lt_u (local.get $a) (local.get $b))))
)
