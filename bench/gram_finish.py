# The numpy Gram path's finish-and-write of one activation (K channels, 256 rows) as a whole float64
# matrix ("whole": the old path) or in mirrored row blocks ("rows"): time and peak RSS.
#   .venv/bin/python bench/gram_finish.py whole|rows K     (from the repository root)
import sys, os, resource, time
sys.path.insert(0, 'calib')
import numpy as np
os.environ["OPENBLAS_NUM_THREADS"]="1"
import accumulator
K=int(sys.argv[2]); mode=sys.argv[1]
acc=accumulator.Accumulator("x",K)
X=np.random.default_rng(0).standard_normal((256,K)).astype(np.float32)
acc.update(X,None)
base=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t=time.time()
if mode=="whole":
    g=acc.gram_f64(); g.astype("<f8").tofile(os.path.join(os.environ.get("TMPDIR", "/tmp"), "gram_finish.f64")); del g
else:
    with open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "gram_finish.f64"),"wb") as f:
        for _,b in acc.gram_f64_rows(): b.tofile(f)
print(mode, K, "finish+write %.2f s" % (time.time()-t), "peak RSS before finishing %d MB, after %d MB" % (base//1024, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss//1024))
