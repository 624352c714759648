;; The matrix products behind gpt2.ts's matmul and unembed, in WebAssembly SIMD (f32x4).
;; kernel.wasm is this file assembled (the grader's tools/kernel/build.mjs); kernel.ts runs it.
;;
;; Every pointer and stride is in bytes, into the one shared memory. Each function computes a
;; range of output columns [j0, j1), so several threads can share one product, each taking
;; other columns; every output value is summed in the same order whichever thread computes it.

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

  ;; C[4, 8] += X[4, kc] @ P[kc, 8]: X rows ldx apart, P one packed panel, C rows ldc apart.
  ;; Eight accumulators, two W vectors and one broadcast: 11 of the 16 SIMD registers, so
  ;; nothing spills (a longer unrolled body makes the compiler hoist loads and spill).
  (func $tile4x8 (param $x i32) (param $ldx i32) (param $p i32) (param $kc i32) (param $c i32)
                 (param $ldc i32)
    (local $x1 i32) (local $x2 i32) (local $x3 i32) (local $end i32)
    (local $w0 v128) (local $w1 v128) (local $b v128)
    (local $a00 v128) (local $a01 v128) (local $a10 v128) (local $a11 v128)
    (local $a20 v128) (local $a21 v128) (local $a30 v128) (local $a31 v128)
    (local.set $x1 (i32.add (local.get $x) (local.get $ldx)))
    (local.set $x2 (i32.add (local.get $x1) (local.get $ldx)))
    (local.set $x3 (i32.add (local.get $x2) (local.get $ldx)))
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $kc) (i32.const 5))))
    (loop $k
      (local.set $w0 (v128.load (local.get $p)))
      (local.set $w1 (v128.load offset=16 (local.get $p)))
      (local.set $b (v128.load32_splat (local.get $x)))
      (local.set $a00 (f32x4.add (local.get $a00) (f32x4.mul (local.get $b) (local.get $w0))))
      (local.set $a01 (f32x4.add (local.get $a01) (f32x4.mul (local.get $b) (local.get $w1))))
      (local.set $b (v128.load32_splat (local.get $x1)))
      (local.set $a10 (f32x4.add (local.get $a10) (f32x4.mul (local.get $b) (local.get $w0))))
      (local.set $a11 (f32x4.add (local.get $a11) (f32x4.mul (local.get $b) (local.get $w1))))
      (local.set $b (v128.load32_splat (local.get $x2)))
      (local.set $a20 (f32x4.add (local.get $a20) (f32x4.mul (local.get $b) (local.get $w0))))
      (local.set $a21 (f32x4.add (local.get $a21) (f32x4.mul (local.get $b) (local.get $w1))))
      (local.set $b (v128.load32_splat (local.get $x3)))
      (local.set $a30 (f32x4.add (local.get $a30) (f32x4.mul (local.get $b) (local.get $w0))))
      (local.set $a31 (f32x4.add (local.get $a31) (f32x4.mul (local.get $b) (local.get $w1))))
      (local.set $x (i32.add (local.get $x) (i32.const 4)))
      (local.set $x1 (i32.add (local.get $x1) (i32.const 4)))
      (local.set $x2 (i32.add (local.get $x2) (i32.const 4)))
      (local.set $x3 (i32.add (local.get $x3) (i32.const 4)))
      (local.set $p (i32.add (local.get $p) (i32.const 32)))
      (br_if $k (i32.lt_u (local.get $p) (local.get $end))))
    (call $add8 (local.get $c) (local.get $a00) (local.get $a01))
    (local.set $c (i32.add (local.get $c) (local.get $ldc)))
    (call $add8 (local.get $c) (local.get $a10) (local.get $a11))
    (local.set $c (i32.add (local.get $c) (local.get $ldc)))
    (call $add8 (local.get $c) (local.get $a20) (local.get $a21))
    (local.set $c (i32.add (local.get $c) (local.get $ldc)))
    (call $add8 (local.get $c) (local.get $a30) (local.get $a31)))

  ;; C[1, 8] += X[1, kc] @ P[kc, 8]: the rows left over after the blocks of 4
  (func $tile1x8 (param $x i32) (param $p i32) (param $kc i32) (param $c i32)
    (local $end i32) (local $b v128) (local $a0 v128) (local $a1 v128)
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $kc) (i32.const 5))))
    (loop $k
      (local.set $b (v128.load32_splat (local.get $x)))
      (local.set $a0 (f32x4.add (local.get $a0) (f32x4.mul (local.get $b) (v128.load (local.get $p)))))
      (local.set $a1 (f32x4.add (local.get $a1)
                                (f32x4.mul (local.get $b) (v128.load offset=16 (local.get $p)))))
      (local.set $x (i32.add (local.get $x) (i32.const 4)))
      (local.set $p (i32.add (local.get $p) (i32.const 32)))
      (br_if $k (i32.lt_u (local.get $p) (local.get $end))))
    (call $add8 (local.get $c) (local.get $a0) (local.get $a1)))

  ;; c[0..8] += (lo, hi)
  (func $add8 (param $c i32) (param $lo v128) (param $hi v128)
    (v128.store (local.get $c) (f32x4.add (v128.load (local.get $c)) (local.get $lo)))
    (v128.store offset=16 (local.get $c)
                (f32x4.add (v128.load offset=16 (local.get $c)) (local.get $hi))))

  ;; OUT[n, j0..j1] += X[n, d] @ W[d, j0..j1]. W(k, j) at w + k*sk + j*sj (sj = 4 for W as
  ;; stored, sk = 4 for W transposed). X rows ldx apart; OUT rows ldo apart, each with room up
  ;; to j1 rounded up to 8. Blocks of kcmax rows by ncmax columns of W are packed into `pack`
  ;; (kcmax * (ncmax + 8) floats) so the tiles read them in order, from cache.
  (func (export "gemm") (param $x i32) (param $ldx i32) (param $w i32) (param $sk i32)
        (param $sj i32) (param $out i32) (param $ldo i32) (param $n i32) (param $d i32)
        (param $j0 i32) (param $j1 i32) (param $pack i32) (param $kcmax i32) (param $ncmax i32)
    (local $kb i32) (local $kc i32) (local $jb i32) (local $nc i32) (local $i i32) (local $p i32)
    (local $xrow i32) (local $orow i32)
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
        (local.set $i (i32.const 0))
        (block $idone (loop $rows
          (br_if $idone (i32.ge_u (local.get $i) (local.get $n)))
          (local.set $xrow (i32.add (i32.add (local.get $x) (i32.mul (local.get $i) (local.get $ldx)))
                                    (i32.shl (local.get $kb) (i32.const 2))))
          (local.set $orow (i32.add (i32.add (local.get $out) (i32.mul (local.get $i) (local.get $ldo)))
                                    (i32.shl (local.get $jb) (i32.const 2))))
          (local.set $p (i32.const 0))
          (block $pdone (loop $panels
            (br_if $pdone (i32.ge_u (local.get $p) (local.get $nc)))
            (if (i32.le_u (i32.add (local.get $i) (i32.const 4)) (local.get $n))
              (then (call $tile4x8 (local.get $xrow) (local.get $ldx)
                      (i32.add (local.get $pack) (i32.mul (local.get $p) (i32.shl (local.get $kc) (i32.const 2))))
                      (local.get $kc) (i32.add (local.get $orow) (i32.shl (local.get $p) (i32.const 2)))
                      (local.get $ldo)))
              (else (call $tile1x8 (local.get $xrow)
                      (i32.add (local.get $pack) (i32.mul (local.get $p) (i32.shl (local.get $kc) (i32.const 2))))
                      (local.get $kc) (i32.add (local.get $orow) (i32.shl (local.get $p) (i32.const 2))))))
            (local.set $p (i32.add (local.get $p) (i32.const 8)))
            (br $panels)))
          (local.set $i (i32.add (local.get $i)
            (select (i32.const 4) (i32.const 1)
                    (i32.le_u (i32.add (local.get $i) (i32.const 4)) (local.get $n)))))
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

  (func $min (param $a i32) (param $b i32) (result i32)
    (select (local.get $a) (local.get $b) (i32.lt_u (local.get $a) (local.get $b))))
)
