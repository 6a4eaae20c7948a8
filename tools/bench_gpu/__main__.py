import sys

from tools.bench_gpu.run import main

sys.exit(main())
