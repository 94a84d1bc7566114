"""diagnose_failure reads a failure as the tool that reports it prints it, not only as the corpus's
repositories happened to: each case is one tool's own message (the tool and where it prints it
named), pasted alone, without an exit status, as a person pastes a log. All but two were read as
something else, or as unknown, before the signatures were written from the tools' texts (the
compute-capability warning only by the log model, at low confidence)."""

from __future__ import annotations

from datetime import datetime

import pytest

from nightshift.runtime.config import Settings
from nightshift.runtime.store.db import Store
from nightshift.skills.base import SkillContext
from nightshift.skills.diagnose_failure import diagnose_failure

from conftest import run_skill

CASES: list[tuple[str, str, str]] = [
    # (what prints it, the log, the category)
    (
        "a library's UserWarning carrying ENOSPC, then an error that is its consequence",
        "/usr/lib/python3/dist-packages/torch/serialization.py:100: UserWarning: [Errno 28] No "
        "space left on device\n  warnings.warn(\nTraceback (most recent call last):\n  File "
        '"train.py", line 10, in <module>\n    foo()\n'
        "AttributeError: 'NoneType' object has no attribute 'shape'\n",
        "disk_full",
    ),
    (
        "Windows' ERROR_DISK_FULL (112)",
        "OSError: [WinError 112] There is not enough space on the disk\n",
        "disk_full",
    ),
    ("SQLite's SQLITE_FULL", "sqlite3.OperationalError: database or disk is full\n", "disk_full"),
    (
        "tempfile.gettempdir() when no directory can be written",
        "FileNotFoundError: [Errno 2] No usable temporary directory found in ['/tmp', "
        "'/var/tmp', '/usr/tmp', '/home/u']\n",
        "disk_full",
    ),
    (
        "Windows' ERROR_COMMITMENT_LIMIT (1455) loading torch's DLLs in a DataLoader worker",
        "OSError: [WinError 1455] The paging file is too small for this operation to complete. "
        'Error loading "C:\\Python38\\lib\\site-packages\\torch\\lib\\cudnn_cnn_infer64_8.dll" or '
        "one of its dependencies.\n",
        "host_oom",
    ),
    (
        "C's printf of a negative NaN in a training loop's progress line",
        "Iter: 500, Loss: -nan, Acc: 0.00\nIter: 600, Loss: -nan, Acc: 0.00\n",
        "nan_loss",
    ),
    (
        "apex's dynamic loss scaler halving below 1",
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1.0\n"
        "Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 0.5\n",
        "nan_loss",
    ),
    (
        "XLA reporting the driver API's CUresult",
        "jaxlib.xla_extension.XlaRuntimeError: INTERNAL: Failed to execute XLA Runtime "
        "executable: run time error: custom call 'xla.gpu.func.launch' failed: "
        "CUDA_ERROR_ILLEGAL_ADDRESS\n",
        "cuda_runtime_error",
    ),
    (
        "torch/cuda/__init__.py's warning for a GPU its build has no kernels for",
        "NVIDIA GeForce RTX 4090 with CUDA capability sm_89 is not compatible with the current "
        "PyTorch installation.\nThe current PyTorch install supports CUDA capabilities sm_37 "
        "sm_50 sm_60 sm_70.\n",
        "cuda_runtime_error",
    ),
    (
        "TensorFlow's cuInit with CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        "E tensorflow/stream_executor/cuda/cuda_driver.cc:271] failed call to cuInit: "
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: system has unsupported display driver / cuda driver "
        "combination\n",
        "driver_mismatch",
    ),
    (
        "TensorFlow's cuda_diagnostics.cc beside cuInit's CUDA_ERROR_INVALID_VALUE",
        "E tensorflow/stream_executor/cuda/cuda_driver.cc:491] failed call to cuInit: "
        "CUDA_ERROR_INVALID_VALUE\nE tensorflow/stream_executor/cuda/cuda_diagnostics.cc:296] "
        "kernel version 352.63.0 does not match DSO version 361.93.2 -- cannot find working "
        "devices in this configuration\n",
        "driver_mismatch",
    ),
    (
        "PyYAML's scanner on a config that does not parse",
        'yaml.scanner.ScannerError: mapping values are not allowed here\n  in "configs/train.yaml"'
        ", line 3, column 8\n",
        "config_error",
    ),
    (
        "click's BadParameter",
        "Error: Invalid value for '--epochs': 'ten' is not a valid integer.\n",
        "config_error",
    ),
    (
        "python-fire's unconsumed argument",
        "ERROR: Could not consume arg: --learning_rate\nUsage: train.py <flags>\n",
        "config_error",
    ),
    (
        "absl.flags on an unknown flag",
        "FATAL Flags parsing error: Unknown command line flag 'model_dir'\n",
        "config_error",
    ),
    (
        "pip's resolver",
        "ERROR: Could not build wheels for flash-attn, which is required to install "
        "pyproject.toml-based projects\n",
        "import_or_env",
    ),
    (
        "pip on a pin that does not exist",
        "ERROR: No matching distribution found for torch==1.4.0\n",
        "import_or_env",
    ),
    (
        "cmd.exe for a program not on the PATH",
        "'python' is not recognized as an internal or external command,\noperable program or "
        "batch file.\n",
        "import_or_env",
    ),
    (
        "NumPy 1.24 without the aliases it removed",
        "AttributeError: module 'numpy' has no attribute 'float'.\n",
        "import_or_env",
    ),
    (
        "huggingface_hub for a model id that is not on the Hub",
        "huggingface_hub.utils._errors.RepositoryNotFoundError: 404 Client Error.\n",
        "file_missing",
    ),
    (
        "a program's own check of a path",
        "AssertionError: ./data/coco/images/train2017 does not exist\n",
        "file_missing",
    ),
    (
        "bash's report of a SIGTERMed job",
        "./train.sh: line 12: 1234 Terminated              python train.py\n",
        "killed",
    ),
    ("bash in a German locale (SIGTERM)", "Beendet\n", "killed"),
    ("LSF's owner kill", "TERM_OWNER: job killed by owner.\n", "killed"),
    (
        "Lightning's SIGTERM handler",
        "[rank: 0] Received SIGTERM: 15\nBypassing SIGTERM: 15\n",
        "killed",
    ),
    (
        "a PBS site's epilogue",
        "Exited with exit code 140. Terminated due to wall time limit\n",
        "hang_or_timeout",
    ),
    (
        "glog's fatal CHECK (Caffe)",
        "F0523 10:11:12.123456 12345 net.cpp:123] Check failed: bottom_shape == top_shape (3 vs. "
        "4)\n*** Check failure stack trace: ***\n",
        "crashed",
    ),
    (
        "libstdc++ on an uncaught C++ exception",
        "terminate called after throwing an instance of 'c10::Error'\n  what():  index out of "
        "range in self\n",
        "crashed",
    ),
    (
        "an error line pasted alone, without its traceback",
        "ValueError: Expected input batch_size (32) to match target batch_size (64).\n",
        "crashed",
    ),
    (
        "PyCharm's run console: SIGSEGV",
        "Process finished with exit code 139 (interrupted by signal 11: SIGSEGV)\n",
        "crashed",
    ),
    (  # an access violation says nothing of where: unknown, with how to find out
        "PyCharm on Windows: an access violation (0xC0000005)",
        "Process finished with exit code -1073741819 (0xC0000005)\n",
        "unknown",
    ),
    (
        "PyCharm's run console: SIGKILL, nothing else",
        "Epoch 3/10\nProcess finished with exit code 137 (interrupted by signal 9: SIGKILL)\n",
        "killed",
    ),
    ("zsh's job notice for a SIGKILLed child", "zsh: killed     python train.py\n", "host_oom"),
    (
        "an extension built against another NumPy",
        "RuntimeError: module compiled against API version 0x10 but this version of numpy is 0xf\n",
        "import_or_env",
    ),
    (
        "torch.utils.cpp_extension without ninja",
        "RuntimeError: Ninja is required to load C++ extensions\n",
        "import_or_env",
    ),
    (
        "a CPU-only torch asked for CUDA",
        "AssertionError: Torch not compiled with CUDA enabled\n",
        "import_or_env",
    ),
    (
        "torch.distributed used before init_process_group",
        "RuntimeError: Default process group has not been initialized, please make sure to call "
        "init_process_group.\n",
        "nccl_or_distributed",
    ),
    (
        "Keras' TerminateOnNaN",
        "Epoch 00005: early stopping\nBatch 20: Invalid loss, terminating training\n",
        "nan_loss",
    ),
    (
        "torch.load on a file that is not a whole checkpoint",
        'RuntimeError: Expected hasRecord("version") to be true, but got false.\n',
        "checkpoint_corrupt",
    ),
    (
        "transformers finding no weights file",
        "OSError: Error no file named pytorch_model.bin, tf_model.h5, model.ckpt.index or "
        "flax_model.msgpack found in directory models/bert.\n",
        "file_missing",
    ),
    (
        "glog's CHECK on a file Caffe opens",
        "F0101 00:00:00.000000  1234 io.cpp:36] Check failed: fd != -1 (-1 vs. -1) File not "
        "found: solver_stage1.prototxt\n*** Check failure stack trace: ***\n",
        "file_missing",
    ),
    (
        "Intel's Fortran runtime (MKL on Windows) on Ctrl-C",
        "forrtl: error (200): program aborting due to control-C event\nImage              PC  "
        "              Routine            Line        Source\nlibifcoremd.dll    00007FFC3D1EDF54"
        "  Unknown               Unknown  Unknown\n",
        "killed",
    ),
    (
        "darknet's progress line, its iteration counter before the NaN",
        " 182: -nan, -nan avg loss, 0.000000 rate, 2.011170 seconds, 11648 images\n"
        " 183: -nan, -nan avg loss, 0.000000 rate, 2.055895 seconds, 11712 images\n",
        "nan_loss",
    ),
    (
        "Caffe's protobuf reader on a .caffemodel it cannot parse",
        "F0406 14:36:25.813976 20974 upgrade_proto.cpp:95] Check failed: ReadProtoFromBinaryFile"
        "(param_file, param) Failed to parse NetParameter file: models/VGG16.caffemodel\n",
        "checkpoint_corrupt",
    ),
    (
        "torch.save's writer, its file name and line mangled by markdown",
        "enforce fail at inline_container.cc_595] . unexpected pos 1457862912 vs 1457862800\n",
        "disk_full",
    ),
    (
        "Python's logging with a format of its own: NaN columns after the logger's words",
        "INFO:model, 2022-03-11 14:18:54,833, epoch, 0198, nan, nan, nan, nan\n"
        "INFO:model, 2022-03-11 14:21:24,647, epoch, 0199, nan, nan, nan, nan\n"
        "DEBUG:model, 2022-03-11 14:23:56,727, Training completed!\n",
        "nan_loss",
    ),
    (
        "tqdm's postfix with two losses NaN, on the epoch's one line",
        "Epoch 41/250: 100%|████| 9375/9375 [07:11<00:00, 21.73it/s, DR=713, DF=nan, G=nan, "
        "LR=0.0001]\n",
        "nan_loss",
    ),
    (
        "zsh on a binary built for instructions this CPU lacks (TensorFlow without AVX)",
        "[1]    4567 illegal hardware instruction  python train.py\n",
        "import_or_env",
    ),
    (
        "bash on the same",
        "train.sh: line 3:  4567 Illegal instruction     (core dumped) python train.py\n",
        "import_or_env",
    ),
    (
        "Python warnings only (torch's meshgrid deprecation): nothing failed",
        " UserWarning: torch.meshgrid: in an upcoming release, it will be required to pass the "
        "indexing argument.\n(Triggered internally at ..\\aten\\src\\ATen\\native\\TensorShape.cpp"
        ":3191.)\n",
        "succeeded",
    ),
]


# Read by a signature of the tool's own words, not by the log model's guess (a verdict above low
# confidence; a finished run, without an exit status, is never more than low, and is asserted by
# its reasoning): each was read as something else, or only by the model at low confidence, before
# these signatures (2026-12-06).
SIGNED: list[tuple[str, str, str]] = [
    (
        "mmdetection's check of a head's num_classes against the dataset's classes",
        "AssertionError: The `num_classes` (20) in Shared2FCBBoxHead of MMDataParallel does not "
        "matches the length of `CLASSES` 3) in VOCDataset\n",
        "config_error",
    ),
    (
        "stable-baselines3 given a gymnasium space where it expects gym's",
        '  File "site-packages/stable_baselines3/common/base_class.py", line 180, in __init__\n'
        "    assert isinstance(self.action_space, supported_action_spaces), (\nAssertionError: "
        "The algorithm only supports (<class 'gym.spaces.box.Box'>,) as action spaces but "
        "Box(-2.0, 2.0, (1,), float32) was provided\n",
        "import_or_env",
    ),
    (
        "torch's shared-memory allocator for the DataLoader, without its errno",
        '  File "/opt/conda/lib/python3.8/site-packages/torch/storage.py", line 122, in '
        "_new_shared\n    return cls._new_using_fd(size)\nRuntimeError: unable to write to file "
        "</torch_2211_3300718815>\n",
        "disk_full",
    ),
    (
        "a loop's own finiteness check of its loss (MAE / DeiT-style)",
        "Epoch [3/90]; Iter [120/5004]; Loss 6.91\nLoss is not finite. Terminate training.\n",
        "nan_loss",
    ),
    (
        "verl's guard on the gradient norm",
        "[Global Step: 41] Update Actor Starts ...\nWARN: rank 0 grad_norm is not finite: nan\n",
        "nan_loss",
    ),
    (
        "a loop printing its step and loss, bare",
        "1200 2.4117\n1210 2.3954\n1220 nan\n1230 nan\n1240 nan\n",
        "nan_loss",
    ),
    (
        "NCCL's init finding two ranks on one GPU, its last error as a person pastes it",
        "Last error:\nDuplicate GPU detected : rank 1 and rank 0 both on CUDA device 1000\n",
        "nccl_or_distributed",
    ),
    (
        "transformers' TrainingArguments without a keyword its version removed",
        'Traceback (most recent call last):\n  File "finetune.py", line 61, in <module>\n'
        "TypeError: TrainingArguments.__init__() got an unexpected keyword argument "
        "'evaluation_strategy'\n",
        "import_or_env",
    ),
    (
        "BERT's run_classifier, its evaluation after training",
        "INFO:tensorflow:Finished evaluation at 2019-03-02-10:11:12\nINFO:tensorflow:***** Eval "
        "results *****\nINFO:tensorflow:  eval_accuracy = 0.8431\nINFO:tensorflow:  eval_loss = "
        "0.5012\nINFO:tensorflow:  global_step = 343\nINFO:tensorflow:  loss = 0.5012\n",
        "succeeded",
    ),
    (
        "Isaac Gym's check of the driver's CUDA version",
        "[Warning] [carb.gym.plugin] useGpu is set, forcing single scene\nwarning : CUDA driver "
        "version is 11000, expected at least 11040.\n",
        "driver_mismatch",
    ),
    (
        "DGL's CPU-only build asked for a GPU",
        "dgl._ffi.base.DGLError: [10:02:11] /opt/dgl/src/runtime/c_runtime_api.cc:88: Check "
        "failed: allow_missing: Device API cuda is not enabled. Please install the cuda version "
        "of dgl.\n",
        "import_or_env",
    ),
    (
        "mmcv's load_checkpoint on a path that is no file",
        'Traceback (most recent call last):\n  File "tools/train.py", line 12, in <module>\n'
        "OSError: pretrained/resnet50_v1c.pth is not a checkpoint file\n",
        "file_missing",
    ),
    (
        "a tracker's search for its network's checkpoint",
        'Traceback (most recent call last):\n  File "run.py", line 7, in <module>\n    raise '
        "Exception('No matching checkpoint file found')\nException: No matching checkpoint file "
        "found\n",
        "file_missing",
    ),
    (
        "slurmstepd when a step passes its memory limit (no cgroup OOM)",
        "slurmstepd: error: Step 881203.0 exceeded memory limit (16831488 > 16777216), being "
        "killed\nsrun: error: node12: task 0: Killed\n",
        "host_oom",
    ),
    (
        "LSF's job report at its memory limit",
        "TERM_MEMLIMIT: job killed after reaching LSF memory usage limit.\nExited with exit code "
        "137.\n\nResource usage summary:\n\n    CPU time :   3600.10 sec.\n",
        "host_oom",
    ),
    (
        "LSF's job report, killed by an administrator",
        "TERM_ADMIN: job killed by root or LSF administrator.\nExited with exit code 130.\n",
        "killed",
    ),
    (
        "LSF's job report at its CPU time limit",
        "TERM_CPULIMIT: job killed after reaching LSF CPU usage limit.\nExited with signal "
        "termination: 24.\n",
        "hang_or_timeout",
    ),
    (
        "Slurm cancelling a job for a preemption",
        "slurmstepd: error: *** JOB 77120 ON gpu-a07 CANCELLED AT 2024-03-01T02:11:09 DUE TO "
        "PREEMPTION ***\n",
        "killed",
    ),
    (
        "Snakemake on Ctrl-C",
        "[Fri Mar  1 10:02:11 2024]\nrule train:\n    jobid: 3\n^CTerminating processes on "
        "user request, this might take some time.\n",
        "killed",
    ),
    (
        "LSF's job report when the job exited 0",
        "epoch 30: val_acc 0.912\n\nSuccessfully completed.\n\nResource usage summary:\n\n"
        "    CPU time :                                   7211.52 sec.\n    Max Memory :      "
        "                           2310 MB\n\nThe output (if any) is above this job summary.\n",
        "succeeded",
    ),
    (
        "Python 2's AttributeError on a module (a binding built without a part)",
        'Traceback (most recent call last):\n  File "train.py", line 88, in <module>\n    '
        "loss = ext.gpu_loss(x)\nAttributeError: 'module' object has no attribute 'gpu_loss'\n",
        "import_or_env",
    ),
    (
        "a data loader's own check of a path, as an OSError",
        'Traceback (most recent call last):\n  File "train.py", line 40, in <module>\n'
        "OSError: data/labels_with_ids/000123.txt not found.\n",
        "file_missing",
    ),
    (
        "srun when Slurm takes the job's allocation back",
        "srun: Force Terminated job 16127178\nsrun: error: Job allocation 16127178 has been "
        "revoked\n",
        "killed",
    ),
    (
        "instant-ngp's check of its training images",
        "20:03:30 ERROR    Uncaught exception: No training images were found for NeRF training!\n",
        "file_missing",
    ),
    (
        "torch elastic's SignalException, its name alone as a person pastes it",
        "torch.distributed.elastic.multiprocessing.api.SignalException\n",
        "killed",
    ),
    (
        "KenLM's util/file.cc opening a model that is not there",
        "OSError: Cannot read model 'lm/5gram.bin' (util/file.cc:76 in int util::OpenReadOrThrow("
        "const char*) threw ErrnoException because `-1 == (ret = open(name, 00))'. No such file "
        "or directory while opening /data/lm/5gram.bin)\n",
        "file_missing",
    ),
    (
        "Moses' train-model.perl when a tool it calls is missing",
        "Using SCRIPTS_ROOTDIR: /opt/moses/scripts\nERROR: Cannot find /opt/moses/tools/"
        "merge_alignment.py at train-model.perl line 285.\n",
        "file_missing",
    ),
    (
        "GloVe's malloc check",
        "TRAINING MODEL\nRead 128517745 lines.\nError allocating memory for W\n",
        "host_oom",
    ),
    (
        "spaCy's CLI on a config override it cannot parse",
        "✘ Invalid config override '—': name should start with --\n",
        "config_error",
    ),
    (
        "spaCy's (thinc's) config validation",
        "✘ Config validation error\ntraining -> max_epochs   value is not a valid integer\n",
        "config_error",
    ),
    (
        "Vowpal Wabbit's summary after its last pass",
        "finished run\nnumber of examples = 521326\nweighted example sum = 521326.000000\n"
        "average loss = 0.166395\ntotal feature number = 11469172\n",
        "succeeded",
    ),
    (
        "DyNet's host-memory allocator, the error pasted in Markdown bold",
        '  File "_dynet.pyx", line 5235, in _dynet.Trainer.update\n'
        "**RuntimeError: CPU memory allocation failed**\n",
        "host_oom",
    ),
    (
        "JAX's backend initialisation with an older cuDNN than its build's",
        "CUDA backend failed to initialize: Found cuDNN version 8600, but JAX was built against "
        "version 8906, which is newer. The copy of cuDNN that is installed must be at least as "
        "new as the version against which JAX was built.\n",
        "import_or_env",
    ),
    (
        "TensorFlow's cuda_dnn.cc on a cuDNN other than its build's",
        "E tensorflow/stream_executor/cuda/cuda_dnn.cc:343] Loaded runtime CuDNN library: 7.1.4 "
        "but source was compiled with: 7.4.1.  CuDNN library major and minor version needs to "
        "match or have higher minor version\n",
        "import_or_env",
    ),
    (
        "gin-config on a binding of a parameter the configurable does not take",
        "ValueError: Configurable 'train_fn' doesn't have a parameter named 'hidden_dim'.\n"
        '  In file "configs/base.gin", line 14\n    train_fn.hidden_dim = 0\n',
        "config_error",
    ),
    (
        "the HF Trainer (before 4.40) when metric_for_best_model names a metric evaluation lacks",
        'Traceback (most recent call last):\n  File "run.py", line 9, in <module>\n'
        "    trainer.train()\n"
        '  File "/opt/venv/lib/python3.10/site-packages/transformers/trainer.py", line 2356, in '
        "_save_checkpoint\n    metric_value = metrics[metric_to_check]\nKeyError: 'eval_f1'\n",
        "config_error",
    ),
    (
        "the HF Trainer's own message for the same (4.40 on)",
        "KeyError: \"The `metric_for_best_model` training argument is set to 'eval_f1', which is "
        "not found in the evaluation metrics. The available evaluation metrics are: "
        "['eval_loss']. Consider changing the `metric_for_best_model` via the "
        'TrainingArguments."\n',
        "config_error",
    ),
    (
        "diffusers' from_pretrained on a path that is not there",
        'ValueError: The provided pretrained_model_name_or_path "./weights/unet" is neither a '
        "valid local path nor a valid repo id. Please check the parameter.\n",
        "file_missing",
    ),
    (
        "a training script's own check of its model folder argument",
        "ValueError: Invalid folder path. Please set `args.model_dir` to a valid folder path.\n",
        "file_missing",
    ),
    (
        "torch's lazy CUDA initialisation on a machine where CUDA finds no device",
        '  File "/usr/lib/python3/site-packages/torch/cuda/__init__.py", line 298, in '
        "_lazy_init\n    torch._C._cuda_init()\nRuntimeError: No CUDA GPUs are available\n",
        "driver_mismatch",
    ),
    (
        "CodaLab Worksheets refusing a run its user's disk quota cannot hold",
        "failure_message\tRequested more disk (20g) than user disk quota left (3.1g)\n",
        "disk_full",
    ),
    (
        "glog's fatal check in a C++ trainer (flashlight / wav2letter) on a NaN loss",
        "I1102 10:00:01.000000  911 Train.cpp:571] Epoch 1 started!\n"
        "F1102 10:00:02.493821  911 Train.cpp:616] Loss has NaN values. Samples - utt-0018\n"
        "*** Check failure stack trace: ***\n    @     0x7efd5faca0cd  google::LogMessage::Fail()\n"
        "Aborted (core dumped)\n",
        "nan_loss",
    ),
    (
        "torch RandomSampler on an empty dataset",
        'Traceback (most recent call last):\n  File "train.py", line 40, in <module>\n    loader = DataLoader(ds, batch_size=8, shuffle=True)\n  File "/usr/lib/python3/site-packages/torch/utils/data/sampler.py", line 107, in __init__\n    raise ValueError("num_samples should be a positive integer "\nValueError: num_samples should be a positive integer value, but got num_samples=0\n',
        "file_missing",
    ),
    (
        "old torchvision ImageFolder on a folder with no images",
        "RuntimeError: Found 0 files in subfolders of: data/train\nSupported extensions are: .jpg,.jpeg,.png,.ppm,.bmp,.pgm,.tif\n",
        "file_missing",
    ),
    (
        "OpenCV resize on an image that was not read",
        "cv2.error: OpenCV(4.5.1) /tmp/pip-req-build-7m_g9lbm/opencv/modules/imgproc/src/resize.cpp:3929: error: (-215:Assertion failed) !ssize.empty() in function 'resize'\n",
        "file_missing",
    ),
    (
        "PIL on a file that is not an image",
        "PIL.UnidentifiedImageError: cannot identify image file 'data/train/0001.jpg'\n",
        "file_missing",
    ),
    (
        "open() on a directory",
        "IsADirectoryError: [Errno 21] Is a directory: 'data/'\n",
        "file_missing",
    ),
    (
        "transformers on a model folder without its config",
        "OSError: ./checkpoints/bert does not appear to have a file named config.json. Checkout 'https://huggingface.co/./checkpoints/bert/None' for available files.\n",
        "file_missing",
    ),
    (
        "TensorFlow's checkpoint reader on a prefix with no files",
        "tensorflow.python.framework.errors_impl.NotFoundError: Unsuccessful TensorSliceReader constructor: Failed to find any matching files for ckpt/model.ckpt-1000\n",
        "file_missing",
    ),
    (
        "libsndfile on an audio file it cannot open",
        "soundfile.LibsndfileError: Error opening 'data/wavs/LJ001-0001.wav': System error.\n",
        "file_missing",
    ),
    (
        "bash on a script that is not there",
        "bash: scripts/train.sh: No such file or directory\n",
        "file_missing",
    ),
    (
        "gcc on a header the CUDA toolkit should provide",
        "csrc/nms.cpp:2:10: fatal error: cuda_runtime.h: No such file or directory\n    2 | #include <cuda_runtime.h>\n      |          ^~~~~~~~~~~~~~~~\ncompilation terminated.\n",
        "import_or_env",
    ),
    (
        "nvcc older than the GPU's architecture",
        "nvcc fatal   : Unsupported gpu architecture 'compute_86'\n",
        "import_or_env",
    ),
    (
        "ld on a library that is not installed",
        "/usr/bin/ld: cannot find -lcudart: No such file or directory\ncollect2: error: ld returned 1 exit status\n",
        "import_or_env",
    ),
    (
        "pkg_resources on a missing requirement",
        "pkg_resources.DistributionNotFound: The 'tqdm>=4.27' distribution was not found and is required by this application\n",
        "import_or_env",
    ),
    (
        "importlib.metadata on a package that is not installed",
        "importlib.metadata.PackageNotFoundError: No package metadata was found for bitsandbytes\n",
        "import_or_env",
    ),
    (
        "protobuf 4 on code generated for protobuf 3",
        "TypeError: Descriptors cannot not be created directly.\nIf this call came from a _pb2.py file, your generated code is out of date and must be regenerated with protoc >= 3.19.0.\n",
        "import_or_env",
    ),
    (
        "torchvision built for another torch",
        "RuntimeError: operator torchvision::nms does not exist\n",
        "import_or_env",
    ),
    (
        "torch built against another NumPy",
        "RuntimeError: Numpy is not available\n",
        "import_or_env",
    ),
    (
        "Windows loading torch's DLLs",
        'OSError: [WinError 126] The specified module could not be found. Error loading "C:\\Users\\me\\anaconda3\\lib\\site-packages\\torch\\lib\\c10.dll" or one of its dependencies.\n',
        "import_or_env",
    ),
    (
        "Lightning's MisconfigurationException",
        "lightning_fabric.utilities.exceptions.MisconfigurationException: You requested gpu: [0, 1]\n But your machine only has: [0]\n",
        "config_error",
    ),
    (
        "DeepSpeed's batch-size check",
        "AssertionError: Check batch related parameters. train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 16 != 2 * 1 * 4\n",
        "config_error",
    ),
    (
        "gin-config on a binding nothing registered",
        "ValueError: No configurable matching 'train.learning_rate'.\n  In bindings string line 3\n",
        "config_error",
    ),
    (
        "the CUDA runtime asked for a GPU index the machine does not have",
        "    model = Net().to('cuda:1')\nRuntimeError: CUDA error: invalid device ordinal\n",
        "config_error",
    ),
    (
        "BatchNorm given a batch of one in training",
        "ValueError: Expected more than 1 value per channel when training, got input size "
        "torch.Size([1, 256, 1, 1])\n",
        "config_error",
    ),
    (
        "torch's BatchSampler given a batch size of 0",
        "ValueError: batch_size should be a positive integer value, but got batch_size=0\n",
        "config_error",
    ),
    (
        "PIL before UnidentifiedImageError (Python 2's IOError)",
        "IOError: cannot identify image file u'/data/train/n01688243/n01688243_9115.JPEG'\n",
        "file_missing",
    ),
    (
        "Caffe's solver at the end of its iterations",
        "I0728 00:22:59.593720 24418 solver.cpp:481]     Test net output #1: loss = 1.06661\n"
        "I0728 00:22:59.593730 24418 solver.cpp:411] Optimization Done.\n"
        "I0728 00:22:59.593740 24418 caffe.cpp:187] Optimization Done.\n",
        "succeeded",
    ),
    (
        "DeepSpeed's launcher on a rank that finished",
        "[2024-01-01 10:00:00,000] [INFO] [launch.py:347:main] Process 12345 exits successfully.\n[2024-01-01 10:00:01,000] [INFO] [launch.py:347:main] Process 12346 exits successfully.\n",
        "succeeded",
    ),
    (
        "torchrun's agent when every worker finished",
        "INFO:torch.distributed.elastic.agent.server.api:[default] worker group successfully finished. Waiting 300 seconds for other agents to finish.\nINFO:torch.distributed.elastic.agent.server.api:Local worker group finished (WorkerState.SUCCEEDED). Waiting 300 seconds for other agents to finish\n",
        "succeeded",
    ),
    (
        "wandb at the end of a run that returned",
        "wandb: Waiting for W&B process to finish... (success).\nwandb: \nwandb: Run history:\nwandb: train/loss █▆▄▃▂▁\n",
        "succeeded",
    ),
    (
        "transformers on a local path that does not exist (taken for a Hub id)",
        "huggingface_hub.errors.HFValidationError: Repo id must be in the form 'repo_name' or 'namespace/repo_name': '/data/models/llama-7b'. Use `repo_type` argument if needed.\n",
        "file_missing",
    ),
    (
        "huggingface_hub on a path that is neither a folder nor a repo id",
        "OSError: Incorrect path_or_model_id: './output/checkpoint-500'. Please provide either the path to a local folder or the repo_id of a model on the Hub.\n",
        "file_missing",
    ),
    (
        "datasets on a dataset name the Hub does not have",
        "datasets.exceptions.DatasetNotFoundError: Dataset 'my-org/my-data' doesn't exist on the Hub or cannot be accessed.\n",
        "file_missing",
    ),
    (
        "h5py on a weights file that is not there",
        "OSError: Unable to open file (unable to open file: name = 'weights/model.h5', errno = 2, error message = 'No such file or directory', flags = 0, o_flags = 0)\n",
        "file_missing",
    ),
    (
        "a program's own check that its input exists",
        'Traceback (most recent call last):\n  File "train.py", line 12, in <module>\n    assert os.path.exists(args.data_root), args.data_root\nAssertionError: ./data/coco\n',
        "file_missing",
    ),
    (
        "urllib on pretrained weights whose address is gone",
        "urllib.error.HTTPError: HTTP Error 404: Not Found\n",
        "file_missing",
    ),
    (
        "the Hub on a gated model without access",
        "OSError: You are trying to access a gated repo.\nMake sure to have access to it at https://huggingface.co/meta-llama/Llama-2-7b-hf.\n401 Client Error.\n",
        "file_missing",
    ),
    (
        "transformers too old for a tokenizer class",
        "ValueError: Tokenizer class LlamaTokenizer does not exist or is not currently imported.\n",
        "import_or_env",
    ),
    (
        "transformers too old for a model type",
        "ValueError: The checkpoint you are trying to load has model type `qwen2` but Transformers does not recognize this architecture. This could be because of an issue with the checkpoint, or because your version of Transformers is out of date.\n",
        "import_or_env",
    ),
    (
        "torch's cuDNN check",
        "RuntimeError: cuDNN version incompatibility: PyTorch was compiled  against (8, 9, 2) but found runtime version (8, 5, 0).\n",
        "import_or_env",
    ),
    (
        "Windows failing a DLL's initialisation",
        'OSError: [WinError 1114] A dynamic link library (DLL) initialization routine failed. Error loading "C:\\Python310\\lib\\site-packages\\torch\\lib\\c10.dll" or one of its dependencies.\n',
        "import_or_env",
    ),
    (
        "spaCy on a language model that is not installed",
        "OSError: [E050] Can't find model 'en_core_web_sm'. It doesn't seem to be a Python package or a valid path to a data directory.\n",
        "import_or_env",
    ),
    (
        "pip building a package from source",
        "  error: subprocess-exited-with-error\n  \n  × Getting requirements to build wheel did not run successfully.\n  │ exit code: 1\n",
        "import_or_env",
    ),
    (
        "conda on packages its channels do not have",
        "PackagesNotFoundError: The following packages are not available from current channels:\n\n  - cudatoolkit=11.8\n",
        "import_or_env",
    ),
    (
        "bitsandbytes without its CUDA library",
        "RuntimeError: CUDA Setup failed despite GPU being available. Please run the following command to get more information:\n\n        python -m bitsandbytes\n",
        "import_or_env",
    ),
    (
        "apex's setup.py on a toolkit that differs from torch's",
        "RuntimeError: Cuda extensions are being compiled with a version of Cuda that does not match the version used to compile Pytorch binaries.  Pytorch binaries were compiled with Cuda 11.8.\n",
        "import_or_env",
    ),
    (
        "setuptools without the wheel package",
        "error: invalid command 'bdist_wheel'\n",
        "import_or_env",
    ),
    (
        "a path argument left unset (os.path / open given None)",
        'Traceback (most recent call last):\n  File "train.py", line 30, in <module>\n    with open(args.config) as f:\nTypeError: expected str, bytes or os.PathLike object, not NoneType\n',
        "config_error",
    ),
    (
        "transformers asked for bf16 on a GPU without it",
        "ValueError: Your setup doesn't support bf16/gpu. You need torch>=1.10, using Amp or Apex and CUDA devices\n",
        "config_error",
    ),
    (
        "srun when its job is cancelled",
        "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\nslurmstepd: error: *** STEP 4242.0 ON gpu03 CANCELLED AT 2024-05-01T10:00:00 ***\n",
        "killed",
    ),
    (
        "srun forwarding a termination",
        "srun: forcing job termination\nsrun: got SIGCONT\n",
        "killed",
    ),
    (
        "mpirun on a rank ended by SIGTERM",
        "mpirun noticed that process rank 0 with PID 4242 on node gpu01 exited on signal 15 (Terminated).\n",
        "killed",
    ),
    (
        "the HF Trainer's metrics at the end of training",
        "***** train metrics *****\n  epoch                    =        3.0\n  train_loss               =     0.4123\n  train_runtime            = 0:12:03.11\n",
        "succeeded",
    ),
    (
        "detectron2's last line of training",
        "[05/01 10:00:00 d2.engine.hooks]: Overall training speed: 89997 iterations in 9:21:10 (0.3742 s / it)\n",
        "succeeded",
    ),
    (
        "TensorFlow Estimator at the end of train()",
        "INFO:tensorflow:Saving checkpoints for 10000 into /tmp/model/model.ckpt.\nINFO:tensorflow:Loss for final step: 0.2345.\n",
        "succeeded",
    ),
    (
        "Lua Torch's THC on a CUDA call that failed",
        "luajit: cuda runtime error (30) : unknown error at /tmp/luarocks_cutorch-scm-1/cutorch/lib/THC/THCStorage.c:113\n",
        "cuda_runtime_error",
    ),
    (
        "old PyTorch's THC out of GPU memory",
        "RuntimeError: cuda runtime error (2) : out of memory at /pytorch/aten/src/THC/THCCachingAllocator.cpp:510\n",
        "cuda_oom",
    ),
    (
        "a library's own error naming a path that is not there",
        "lmdb.Error: OCRDataset: AnnFileLoader: data/mixture/Syn90k/label.lmdb: No such file or directory.\n",
        "file_missing",
    ),
    (
        "torch.distributions sampling a policy whose std went bad",
        '  File "/usr/lib/python3/site-packages/torch/distributions/normal.py", line 73, in sample\n    return torch.normal(self.loc.expand(shape), self.scale.expand(shape))\nRuntimeError: normal expects all elements of std >= 0.0\n',
        "nan_loss",
    ),
    (
        "torch.distributions' argument validation on NaN parameters",
        "ValueError: Expected parameter loc (Tensor of shape (64, 12)) of distribution Normal(loc: torch.Size([64, 12]), scale: torch.Size([64, 12])) to satisfy the constraint Real(), but found invalid values:\ntensor([[nan, nan, nan]], device='cuda:0')\n",
        "nan_loss",
    ),
    (
        "a training loop's early stopping, then its test",
        "EarlyStopping counter: 3 out of 3\nEarly stopping\n>>>>>>>testing : exp_4<<<<<<<\nmse:0.1023908406496048, mae:0.2515934407711029\n",
        "succeeded",
    ),
    (
        "Apple's MPS backend",
        "RuntimeError: MPS backend out of memory (MPS allocated: 17.50 GB, other allocations: 1.20 GB, max allowed: 18.13 GB). Tried to allocate 256.00 MB on private pool.\n",
        "cuda_oom",
    ),
    (
        "c10d's TCPStore client timing out",
        "RuntimeError: The client socket has timed out after 1800000ms while trying to connect to (10.0.0.1, 29500).\n",
        "nccl_or_distributed",
    ),
    (
        "PaddlePaddle's allocator failing on the GPU (paddle::memory BadAlloc)",
        "W0301 10:02:11.120 operator.cc:179] conv2d raises an exception "
        "paddle::memory::allocation::BadAlloc\n\nOut of memory error on GPU 1. Cannot allocate "
        "1.250000GB memory on GPU 1, available memory is only 312.500000MB.\n",
        "cuda_oom",
    ),
    (
        "PaddlePaddle's dynamic loader without cuDNN",
        "Error: Cannot load cudnn shared library. Cannot invoke method cudnnGetVersion at "
        "(/paddle/paddle/fluid/platform/dynload/cudnn.cc:63)\n",
        "import_or_env",
    ),
    (
        "jax checking the installed jaxlib",
        "RuntimeError: jaxlib is version 0.3.2, but this version of jax requires version >= "
        "0.4.1.\n",
        "import_or_env",
    ),
    (
        "JAX's coordination service when a host never reaches a barrier",
        "jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: "
        "PjRT_Client_Connect. Timed out task names:\n/job:jax_worker/replica:0/task:1\n",
        "nccl_or_distributed",
    ),
    (
        "PyMC's report once its chains are drawn",
        "Multiprocess sampling (4 chains in 4 jobs)\nNUTS: [mu, sigma]\nSampling 4 chains for "
        "1_000 tune and 2_000 draw iterations (4_000 + 8_000 draws total) took 41 seconds.\n",
        "succeeded",
    ),
    (
        "PyMC's divergence check after sampling",
        "NUTS: [alpha, beta]\n100%|##########| 6000/6000 [00:31<00:00, 190.2draws/s]\nThere "
        "were 14 divergences after tuning. Increase `target_accept` or reparameterize.\n",
        "succeeded",
    ),
    (
        "rstan's warnings on the fit it returned",
        "Chain 4:  Elapsed Time: 2.1 seconds (Warm-up)\nChain 4:                3.3 seconds "
        "(Total)\nWarning messages:\n1: There were 31 divergent transitions after warmup. See "
        "https://mc-stan.org/misc/warnings.html\n",
        "succeeded",
    ),
    (
        "a training script's own early stopping, as it leaves the loop",
        "Epoch 14: val_loss 0.3121\nEpoch 15: val_loss 0.3170\nEarly stopping triggered at "
        "epoch 15. Best val_loss: 0.3098\n",
        "succeeded",
    ),
    (
        "ChatGLM's tokenizer code loaded by a newer transformers",
        '  File "/root/.cache/huggingface/modules/transformers_modules/chatglm-6b/tokenization_'
        'chatglm.py", line 244, in vocab_size\n    return self.sp_tokenizer.num_tokens\n'
        "AttributeError: 'ChatGLMTokenizer' object has no attribute 'sp_tokenizer'\n",
        "import_or_env",
    ),
    (
        "a CUDA program's fatal log when its host allocation fails (OpenCL's status alike)",
        "2024-03-02 10:11:07,004 INFO [default] #sv = 2048\n2024-03-02 10:11:19,311 FATAL "
        "[default] out of host memory\nAborted (core dumped)\n",
        "host_oom",
    ),
    (
        "Python's NameError for a compiled extension the code imports optionally (Mamba's kernels)",
        '  File "/work/models/ss2d.py", line 88, in forward\n    out, x, *rest = '
        "selective_scan_cuda.fwd(u, delta, A, B, C, D, None, True)\nNameError: name "
        "'selective_scan_cuda' is not defined\n",
        "import_or_env",
    ),
    (
        "docker without the NVIDIA runtime",
        'docker: Error response from daemon: could not select device driver "" with capabilities: [[gpu]].\n',
        "driver_mismatch",
    ),
    (
        "MLX on Apple silicon: Metal out of memory",
        "Iter 40: Train loss 1.723, Learning Rate 1.000e-05, It/sec 0.739, Peak mem 32.138 GB\n"
        "libc++abi: terminating due to uncaught exception of type std::runtime_error: [METAL] "
        "Command buffer execution failed: Insufficient Memory "
        "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)\n"
        "zsh: abort      python -m mlx_lm.lora --train --model ./model\n",
        "cuda_oom",
    ),
    (
        "a ROCm build of PyTorch out of GPU memory",
        '  File "train.py", line 88, in <module>\n    out = model(x)\nRuntimeError: HIP out of '
        "memory. Tried to allocate 20.00 MiB (GPU 0; 7.98 GiB total capacity; 7.70 GiB already "
        "allocated; 0 bytes free)\n",
        "cuda_oom",
    ),
    (
        "the HIP runtime without a code object for this GPU",
        "2021-05-27 12:35:24.177308: I tensorflow/stream_executor/platform/default/dso_loader.cc:53]"
        " Successfully opened dynamic library libamdhip64.so\n"
        '/src/rocclr/hip_code_object.cpp:486: "hipErrorNoBinaryForGpu: Unable to find code object '
        'for all current devices!"\nAborted (core dumped)\n',
        "cuda_runtime_error",
    ),
    (
        "rocBLAS without kernels for this GPU's architecture",
        "Epoch 1/10\nrocBLAS error: Cannot read /opt/rocm/lib/rocblas/library/TensileLibrary.dat: "
        "No such file or directory for GPU arch : gfx1032\nAborted (core dumped)\n",
        "cuda_runtime_error",
    ),
    (
        "a HIP call that failed in a ROCm build of PyTorch",
        '  File "train.py", line 40, in <module>\n    loss.backward()\nRuntimeError: HIP error: '
        "invalid device function\nHIP kernel errors might be asynchronously reported at some "
        "other API call, so the stacktrace below might be incorrect.\n",
        "cuda_runtime_error",
    ),
    (
        "DGL's distributed RPC server that cannot bind",
        "Start server 0\n[12:01:07] /opt/dgl/src/rpc/network/tcp_socket.cc:69: Failed bind on "
        "10.0.3.4:30050 ,errno=99\ndgl._ffi.base.DGLError: [12:01:07] "
        "/opt/dgl/src/rpc/network/socket_communicator.cc:197: Cannot bind to 10.0.3.4:30050\n",
        "nccl_or_distributed",
    ),
    (
        "torch's MultiheadAttention given a width its heads do not divide",
        '  File "/usr/lib/python3/site-packages/torch/nn/modules/activation.py", line 1009, in '
        '__init__\n    assert self.head_dim * num_heads == self.embed_dim, "embed_dim must be '
        'divisible by num_heads"\nAssertionError: embed_dim must be divisible by num_heads\n',
        "config_error",
    ),
    (
        "a loop's own words for a NaN loss",
        "epoch 3 step 120 loss 0.512\nFinding NaN in diffusion loss\n"
        "Finding NaN in diffusion loss\n",
        "nan_loss",
    ),
    (
        "torch's ConcatDataset given no datasets (a data root with none of what it looks for)",
        '  File "/opt/conda/lib/python3.8/site-packages/torch/utils/data/dataset.py", line 223, '
        "in __init__\n    assert len(self.datasets) > 0, 'datasets should not be an empty "
        "iterable'  # type: ignore[arg-type]\nAssertionError: datasets should not be an empty "
        "iterable\n",
        "file_missing",
    ),
    (
        "a training platform relaying Kubernetes' OOM kill in its own words",
        "Jul 09, 16:45:16 | [INFO] | container workspace is oom-killed.\n"
        "Jul 09, 16:45:16 | [INFO] | Workload status changed to stopping\n"
        "Jul 09, 16:45:51 | [INFO] | Pod deleted.\n",
        "host_oom",
    ),
    (
        "Habana Gaudi out of device memory",
        '  File "train.py", line 70, in _train_epoch\n    loss.backward()\nRuntimeError: FATAL ERROR '
        ":: MODULE:DEVMEM Allocation failed for size::1646821376\n",
        "cuda_oom",
    ),
    (
        "Habana Gaudi's graph compiler out of workspace memory",
        "RuntimeError: FATAL ERROR :: MODULE:SYNHELPER workspace Allocation of size ::14493510400 "
        "failed!\n",
        "cuda_oom",
    ),
    (
        "XLA on a TPU out of HBM (torch_xla)",
        "| epoch 001 | loss 9.812 | ups 1.2\n2020-10-22 02:48:58 10.128.0.33 [3]   (1) Resource "
        "exhausted: Attempting to allocate 180.59M. That was not possible. There are 142.58M "
        "free.; (0x3x0_HBM1)\n",
        "cuda_oom",
    ),
    (
        "a setup script's own disk check",
        "L4T VERSION 32.6.1 is in the allowed: OK!\nInsufficient disk space. Required: 16G, "
        "Available: 3G.\nAn error occurred. Exiting...\n",
        "disk_full",
    ),
    (
        "darknet's image loader",
        " 2: 648.2, 648.3 avg loss, 0.000000 rate, 3.1 seconds, 128 images\n"
        "Cannot load image /content/darknet/data/obj/img(107).jpg\n",
        "file_missing",
    ),
    (
        "glibc's loader: libgomp loaded too late on aarch64",
        "OSError: /usr/lib/aarch64-linux-gnu/libgomp.so.1: cannot allocate memory in static TLS "
        "block\n",
        "import_or_env",
    ),
    (
        "the HIP runtime's own error code",
        '  File "train.py", line 52, in <module>\n    x = x.to(device)\nRuntimeError: '
        "hipErrorInvalidDeviceFunction: invalid device function\n",
        "cuda_runtime_error",
    ),
    (
        "MIOpen failing (ROCm's cuDNN)",
        "MIOpen Error: /long_pathname_so_that_rpms_can_package_the_debug_info/src/MIOpen/src/"
        "ocl/convolutionocl.cpp:1083: No suitable algorithm was found to execute the required "
        "convolution\nRuntimeError: miopenStatusUnknownError\n",
        "cuda_runtime_error",
    ),
    (
        "Ascend's torch_npu out of device memory",
        '  File "train.py", line 77, in train_step\n    loss.backward()\nRuntimeError: NPU out '
        "of memory. Tried to allocate 2.00 GiB (NPU 0; 60.97 GiB total capacity; 58.11 GiB "
        "already allocated; 58.11 GiB current active; 1.02 GiB free)\n",
        "cuda_oom",
    ),
    (
        "intel-extension-for-pytorch on an Arc GPU out of device memory",
        "2026-01-12 09:14:02 | INFO | epoch 1 step 40 loss 1.92\n2026-01-12 09:14:05 | ERROR | "
        "train_loop:88 - Training failed: Native API failed. Native API returns: 39 "
        "(UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)\n",
        "cuda_oom",
    ),
    (
        "an Intel Arc GPU given a kernel that uses 64-bit floats",
        '  File "train.py", line 40, in <module>\n    loss = criterion(pred.double(), y)\n'
        "RuntimeError: Native API failed. Native API returns: -996 (Function exists but address "
        'is not available)\ninvalid_kernel("uses-fp64-math")\n',
        "cuda_runtime_error",
    ),
    (
        "NNCF that cannot build its CUDA quantization kernels",
        '  File "site-packages/nncf/torch/quantization/extensions.py", line 92, in load\n'
        "    raise RuntimeError(\nRuntimeError: CUDA is available for PyTorch, but NNCF could "
        "not compile GPU quantization extensions. Make sure that 'nvcc' is on your PATH.\n",
        "import_or_env",
    ),
    (
        "a draccus config (LeRobot) that needs an argument the command line left out",
        "$ python train.py --policy.type=act --env.type=aloha\nTraceback (most recent call "
        'last):\n  File "configs/train.py", line 120, in validate\n    raise ValueError(\n'
        "ValueError: 'policy.repo_id' argument missing. Please specify it to push the model "
        "to the hub.\n",
        "config_error",
    ),
    (
        "tf_cnn_benchmarks' summary after its last step",
        "Step\tImg/sec\ttotal_loss\n90\timages/sec: 412.0 +/- 0.3 (jitter = 2.1)\t7.905\n"
        "100\timages/sec: 412.2 +/- 0.3 (jitter = 2.0)\t7.871\n"
        "----------------------------------------------------------------\n"
        "total images/sec: 411.96\n"
        "----------------------------------------------------------------\n",
        "succeeded",
    ),
    (
        "torch's cross-entropy given a class weight list of another length than the classes",
        '  File "train.py", line 142, in train_epoch\n    loss = criterion(out, target)\n'
        "RuntimeError: weight tensor should be defined either for all or no classes\n",
        "config_error",
    ),
    (
        "guided-diffusion's UNet asked for an image size it has no channel layout for",
        '  File "guided_diffusion/script_util.py", line 148, in create_model\n    raise '
        'ValueError(f"unsupported image size: {image_size}")\nValueError: unsupported image '
        "size: 48\n",
        "config_error",
    ),
    (
        "torch_scatter built for another PyTorch",
        '  File "models/layers.py", line 88, in forward\n    out = scatter_add(src, index, dim=0)\n'
        "RuntimeError: scatter_add() expected at most 5 argument(s) but received 6 argument(s)\n",
        "import_or_env",
    ),
    (
        "PEFT's LoRA config naming modules the model does not have",
        '  File "site-packages/peft/tuners/tuners_utils.py", line 421, in inject_adapter\n'
        "    raise ValueError(\nValueError: Target modules {'q_proj', 'v_proj'} not found in the "
        "base model. Please check the target modules and try again.\n",
        "config_error",
    ),
    (
        "TensorFlow Quantum's compiled ops missing from a Windows install",
        '  File "site-packages/tensorflow/python/framework/load_library.py", line 54, in '
        "load_op_library\n    lib_handle = py_tf.TF_LoadLibrary(library_filename)\n"
        "tensorflow.python.framework.errors_impl.NotFoundError: C:\\env\\Lib\\site-packages\\"
        "tensorflow_quantum\\core\\ops\\_tfq_utility_ops.so not found\n",
        "import_or_env",
    ),
    (
        "a Caffe build without the layer a fork's prototxt names",
        "I0302 10:11:09.112233  811 layer_factory.hpp:77] Creating layer data\n"
        "F0302 10:11:09.112301  811 layer_factory.hpp:81] Check failed: registry.count(type) == "
        "1 (0 vs. 1) Unknown layer type: PairedImageData (known types: AbsVal, Accuracy)\n"
        "*** Check failure stack trace: ***\nAborted (core dumped)\n",
        "import_or_env",
    ),
    (
        "an AllenNLP jsonnet config that does not parse",
        '  File "allennlp/common/params.py", line 455, in from_file\n    file_dict = '
        "json.loads(evaluate_file(params_file, ext_vars=ext_vars))\nRuntimeError: STATIC "
        "ERROR: configs/ner.jsonnet:12:5-9: expected a comma before next field.\n",
        "config_error",
    ),
    (
        "argparse under Python 2 refusing a command line that lacks a required argument",
        "usage: train.py [-h] --data DATA [--epochs EPOCHS]\n"
        "train.py: error: argument --data is required\n",
        "config_error",
    ),
    (
        "torchreid's check that the dataset folder is there",
        '  File "torchreid/data/datasets/dataset.py", line 241, in check_before_run\n'
        "    raise RuntimeError('\"{}\" is not found'.format(f))\n"
        "RuntimeError: '/data/market1501/bounding_box_train' is not available\n",
        "file_missing",
    ),
    (
        "a data path the script checked and printed as missing",
        "loading features ...\n./data/coco/feats/val2017 NOT EXIST\n",
        "file_missing",
    ),
    (
        "a dataset loader that asks for a manual download",
        '  File "datasets/duke.py", line 40, in __init__\n    raise RuntimeError(\n'
        "RuntimeError: Please download the dataset manually from the authors' page into "
        "data/duke\n",
        "file_missing",
    ),
    (
        "torch.hub's check of a downloaded weights file",
        '  File "torch/hub.py", line 639, in download_url_to_file\n    raise RuntimeError(\n'
        'RuntimeError: invalid hash value (expected "3c1a2b7f", got '
        '"9f0e11aa52c7d93fb0c3f1d2a4e8b6c07d5e9a1b2c3d4e5f60718293a4b5c6d7")\n',
        "checkpoint_corrupt",
    ),
    (
        "torchaudio saving a file with no audio backend installed",
        '  File "torchaudio/_backend/utils.py", line 221, in get_save_func\n    raise '
        "RuntimeError(\nRuntimeError: Couldn't find appropriate backend to handle uri "
        "samples/epoch_3.flac and format None.\n",
        "import_or_env",
    ),
    (
        "a patch of LLaMA's attention written for an older transformers",
        '  File "llama_attn_replace.py", line 58, in forward\n    cos, sin = '
        "self.rotary_emb(value_states, seq_len=kv_seq_len)\nAttributeError: 'LlamaSdpaAttention'"
        " object has no attribute 'rotary_emb'\n",
        "import_or_env",
    ),
    (
        "an import error pasted without its class name",
        "$ python tools/train_net.py --config-file configs/glip_tiny.yaml\n"
        "cannot import name '_C' from 'maskrcnn_benchmark'\n",
        "import_or_env",
    ),
    (
        "torch's older wording of a checkpoint whose shapes do not fit the model",
        "loading checkpoint from work_dirs/coco/latest.pth\nWhile copying the parameter named "
        "head.cls_conv.weight, whose dimensions in the model are torch.Size([2, 256, 3, 3]) and "
        "whose dimensions in the checkpoint are torch.Size([80, 256, 3, 3])\n",
        "crashed",
    ),
    (
        "a C++ program given a folder where it reads a file",
        "loading weights from rsc/\nterminate called after throwing an instance of "
        "'std::__ios_failure'\n  what():  basic_filebuf::underflow error reading the file: Is a "
        "directory\nAborted (core dumped)\n",
        "file_missing",
    ),
    (
        "a vocabulary path the script checked, quoted with the space inside",
        "# Vocab file /data/vocab.en exists\nValueError:vocab_file '/data/vocab.de 'does not "
        "exist.\n",
        "file_missing",
    ),
    (
        "a checkpoint of torch's zip format read with plain pickle",
        '  File "tools/test.py", line 31, in load_model\n    state = pickle.load(f)\n'
        "_pickle.UnpicklingError: A load persistent id instruction was encountered,\n"
        "but no persistent_load function was specified.\n",
        "checkpoint_corrupt",
    ),
    (
        "a Keras run a person stopped: the terminal's echo of Ctrl-C after the progress bar",
        "Epoch 3/50\n 812/2250 [=========>....................] - ETA: 9:12 - loss: 1.2711"
        "\n 816/2250 [=========>....................] - ETA: 9:10 - loss: 1.2703^C\n",
        "killed",
    ),
    (
        "bash under zh_CN reporting a SIGKILLed job (行 for line)",
        "./scripts/demo.sh: 行 104: 30820 已杀死               /opt/conda/bin/python3 "
        "train.py --dataroot data/AB --name fr\n",
        "host_oom",
    ),
    (
        "bash under de_DE reporting a SIGKILLed job (Zeile for line)",
        "Epoch 3:  41%|####      | 820/2000\n./run.sh: Zeile 12:  4242 Getötet  python train.py\n",
        "host_oom",
    ),
    (
        "torch.fft failing in cuFFT",
        '  File "src/arch/s4.py", line 967, in forward\n'
        "    k = torch.fft.irfft(k_f, n=discrete_L)  # (B+1, C, H, L)\n"
        "RuntimeError: cuFFT error: CUFFT_INTERNAL_ERROR\n",
        "cuda_runtime_error",
    ),
    (
        "GLEW with no OpenGL context (a simulator on a headless server)",
        "Setting up environment\nERROR: GLEW initalization error: Missing GL version\n\n"
        "Press Enter to exit ...\n",
        "import_or_env",
    ),
    (
        "an X11 client with no display",
        "Loading scene...\nqt.qpa.xcb: could not connect to display \nqt.qpa.plugin: Could not "
        'load the Qt platform plugin "xcb" in "" even though it was found.\n',
        "import_or_env",
    ),
    (
        "flash-attn's function called where its import was skipped",
        '  File "ochat/models/unpadded_llama.py", line 184, in forward\n'
        "    attn_output = flash_attn_varlen_func(\n"
        "NameError: name 'flash_attn_varlen_func' is not defined\n",
        "import_or_env",
    ),
    (
        "absl given a --flagfile that does not exist",
        "FATAL Flags parsing error: ERROR:: Unable to open flagfile: [Errno 2] No such file or "
        "directory: 'logdir/cat/opts.log'\n",
        "file_missing",
    ),
    (
        "vedo unable to load a mesh file",
        "> Error in load(): cannot load data/Sample_02_d.vtp\nTraceback (most recent call "
        'last):\n  File "step1_augmentation.py", line 65, in <module>\n    '
        "mesh.applyTransform(vtk_matrix)\nAttributeError: 'NoneType' object has no attribute "
        "'applyTransform'\n",
        "file_missing",
    ),
    (
        "a PyTorch 0.3 loop indexing its loss under 0.4 or later",
        'Epoch: 0\nTraceback (most recent call last):\n  File "train.py", line 165, in train\n'
        "    train_loss += loss.data[0]\nIndexError: invalid index of a 0-dim tensor. Use "
        "tensor.item() to convert a 0-dim tensor to a Python number\n",
        "import_or_env",
    ),
    (
        "torch.stft called without return_complex under PyTorch 2",
        '  File "mel_processing.py", line 66, in spectrogram_torch\n    spec = torch.stft(y, '
        "n_fft, hop_length=hop_size)\nRuntimeError: stft requires the return_complex parameter "
        "be given for real inputs, and will further require that return_complex=True in a "
        "future PyTorch release.\n",
        "import_or_env",
    ),
    (
        "PyTorch Geometric 1's layer attributes under version 2",
        "    init.xavier_normal_(self.gnn1.weight)\ntorch.nn.modules.module.ModuleAttributeError: "
        "'GCNConv' object has no attribute 'weight'\n",
        "import_or_env",
    ),
    (
        "wandb given a sweep file that does not exist",
        "$ python -m wandb sweep sweeps/sweep_db.yml\nwandb: Creating sweep from: "
        "sweeps/sweep_db.yml\nwandb: ERROR Couldn't open sweep file: sweeps/sweep_db.yml\n",
        "file_missing",
    ),
    (
        "wandb with no API key where it cannot prompt for one",
        "wandb: ERROR api_key not configured (no-tty). call wandb.login(key=[your_api_key])\n",
        "config_error",
    ),
    (
        "qlib's epoch summary with both losses NaN",
        "[20964:MainThread](2024-07-26 23:06:46,892) INFO - qlib.ALSTM - [pytorch_alstm.py:245] - "
        "train nan, valid nan\n",
        "nan_loss",
    ),
    (
        "the CARLA client timing out on its simulator",
        "========= Preparing RouteScenario_3 (repetition 0) =========\nRuntimeError: time-out of "
        "600000ms while waiting for the simulator, make sure the simulator is ready and "
        "connected to localhost:30000\n",
        "hang_or_timeout",
    ),
    (
        "zsh running a command's options as commands (lines without their backslash)",
        "usage: style.py [-h] --checkpoint-dir CHECKPOINT_DIR --style STYLE\nstyle.py: error: "
        "unrecognized arguments:  \nzsh: command not found: --test\nzsh: command not found: "
        "--test-dir\nzsh: command not found: --content-weight\n",
        "config_error",
    ),
    (
        "wandb's UsageError with no API key",
        '  File "wandb/sdk/wandb_login.py", line 247, in prompt_api_key\n    raise UsageError('
        '"api_key not configured (no-tty). call " + directive)\nwandb.errors.UsageError: '
        "api_key not configured (no-tty). call wandb.login(key=[your_api_key])\n",
        "config_error",
    ),
    (
        "TensorFlow's histogram summary of a tensor gone NaN",
        "InvalidArgumentError (see above for traceback): Nan in summary histogram for: D_X/fake\n"
        "\t [[Node: D_X/fake = HistogramSummary[T=DT_FLOAT]]]\n",
        "nan_loss",
    ),
    (
        "tensorboardX warning of a NaN it was asked to log",
        "Steps:  12%|#2        | 120/1000 [02:11<16:00, loss=nan]\n"
        "WARNING - tensorboardX.x2num - NaN or Inf found in input tensor.\n",
        "nan_loss",
    ),
    (
        "torch's zip reader's message printed without its class",
        "failed reading zip archive: failed finding central directory\n",
        "checkpoint_corrupt",
    ),
    (
        "Hydra older than the code's version_base",
        '  File "splade/index.py", line 13, in <module>\n    @hydra.main(config_path=CONFIG_PATH, '
        'config_name=CONFIG_NAME, version_base="1.2")\nTypeError: main() got an unexpected '
        "keyword argument 'version_base'\n",
        "import_or_env",
    ),
]


@pytest.fixture
def ctx(tmp_path) -> SkillContext:
    return SkillContext(
        store=Store(f"sqlite:///{tmp_path}/s.db"),
        settings=Settings(home=str(tmp_path)),
        now=datetime(2026, 12, 6, 3, 0),
    )


@pytest.mark.parametrize(("tool", "log", "category"), CASES, ids=[c[0][:48] for c in CASES])
def test_a_tools_own_message_is_read_as_its_cause(ctx, tool, log, category):
    r = run_skill(diagnose_failure, ctx, {"log_tail": log})
    assert r.category == category, (tool, r.category, r.reasoning)


@pytest.mark.parametrize(("tool", "log", "category"), SIGNED, ids=[c[0][:48] for c in SIGNED])
def test_a_tools_own_message_is_read_by_a_signature(ctx, tool, log, category):
    r = run_skill(diagnose_failure, ctx, {"log_tail": log})
    by_signature = (
        "reported the run complete" in r.reasoning and "no signature decides" not in r.reasoning
        if category == "succeeded"
        else r.confidence != "low"
    )
    assert (r.category, by_signature) == (category, True), (tool, r.reasoning)


@pytest.mark.parametrize(
    "end",
    [
        "Test set results: loss 0.903, acc 0.765.\n",
        "testing accuracy = 0.7773, 0.6055\ntesting time = 0.04 min\n",
        "Final test mAP: 41.2\n",
        "Saving the model to out/model.pt\nDone.\n",
        "Total training time: 3:02:11\n",
        # metrics by their logged names, and a workflow manager's last word (stop 52)
        "eval_accuracy = 0.05\neval_loss = 0.1677554\n",
        "Accuracy/Test: 49.61, Loss/Test: 0.868\n",
        "DEBUG nextflow.script.ScriptRunner - > Execution complete -- Goodbye\n",
    ],
)
def test_a_log_that_ends_in_its_test_results_reached_its_end(ctx, end):
    log = "Epoch 1498: train loss 0.167 train acc: 0.950\nEpoch 1499: train loss 0.219\n" + end
    r = run_skill(diagnose_failure, ctx, {"log_tail": log})
    assert (r.category, r.confidence) == ("succeeded", "low"), r.reasoning
    assert "no signature decides" not in r.reasoning  # the rules read it, not the log model
    # a validation line an epoch prints on its way is no end: the log may stop in the next epoch
    r = run_skill(diagnose_failure, ctx, {"log_tail": log.replace(end, "val loss 1.03 acc 0.72\n")})
    assert r.category != "succeeded"
    # and the results with an exit status that failed do not make it a success
    r = run_skill(diagnose_failure, ctx, {"log_tail": log, "exit_code": 1})
    assert r.category != "succeeded"


def test_info_lines_that_just_end_are_not_a_finished_run(ctx):
    """Only warnings reads as finished; a log of INFO lines that stops (DeepSpeed starting its
    process group) does not."""
    log = (
        "[2024-06-11 00:23:36,254] [INFO] [comm.py:637:init_distributed] cdb=None\n"
        "[2024-06-11 00:23:36,254] [INFO] [comm.py:668:init_distributed] Initializing "
        "TorchBackend in DeepSpeed with backend nccl\n"
    )
    assert run_skill(diagnose_failure, ctx, {"log_tail": log}).category != "succeeded"


def test_a_warning_that_says_something_stopped_is_not_success(ctx):
    log = "WARNING:root:kernel 64d26b43-fec6-4352-bdc2-0a820f7219c6 restarted\n"
    assert run_skill(diagnose_failure, ctx, {"log_tail": log}).category != "succeeded"


def _traceback(code: str, error: str) -> str:
    return (
        'Traceback (most recent call last):\n  File "train.py", line 63, in train\n'
        f"    {code}\n{error}\n"
    )


@pytest.mark.parametrize(
    ("code", "error", "category"),
    [
        ('num_workers=cfg["training"]["n_workers"],', "KeyError: 'n_workers'", "config_error"),
        ("value = self.params.pop(key)", "KeyError: 'train_data_path'", "config_error"),
        (
            "args = conf.compile(conf.load(args['exp']))['Experiment']",
            "KeyError: 'Experiment'",
            "config_error",
        ),
        # a config named for what it configures (stop 52)
        ("num=data_config['n_samples'],", "KeyError: 'n_samples'", "config_error"),
        # an assert on the settings, and a config object without the field asked (stop 52)
        ("assert args.batch_size % len(devices) == 0", "AssertionError", "config_error"),
        (
            "assert len(opt.select_data) == len(opt.batch_ratio)",
            "AssertionError: select_data and batch_ratio differ",
            "config_error",
        ),
        (
            "datasets = [build_dataset(cfg.data.train)]",
            "AttributeError: 'ConfigDict' object has no attribute 'train'",
            "config_error",
        ),
        # a lookup in the program's own data is its own bug (or its data's), not the config's
        ("index = self._map[image_id]", "KeyError: '391090'", "crashed"),
        ("label = labels[name]", "KeyError: 'cat'", "crashed"),
        ("assert abs(ll_0 - ll_1) < 1e-2", "AssertionError", "crashed"),
        ("assert img is not None", "AssertionError", "crashed"),
        (
            "x = self.model.train",
            "AttributeError: 'Net' object has no attribute 'train'",
            "crashed",
        ),
    ],
)
def test_a_key_error_reading_a_config_is_the_configs(ctx, code, error, category):
    r = run_skill(diagnose_failure, ctx, {"log_tail": _traceback(code, error), "exit_code": 1})
    assert r.category == category, r.reasoning


PROGRESS = "".join(
    f"2020-10-19 22:0{i}:12,688 - mmdet - INFO - Epoch [1][{4400 + 50 * i}/4502]   lr: 0.00357, "
    f"eta: 1 day, 1:24:38, time: 0.879, data_time: 0.006, loss_cls: 0.47\n"
    for i in range(3)
)


def test_a_pasted_log_that_just_stops_reads_as_a_hang(ctx):
    """No exit status, no error, nothing that says the process ended: in reports of this shape a
    hang is what people most often find (low confidence, with what to check)."""
    r = run_skill(diagnose_failure, ctx, {"log_tail": PROGRESS})
    assert (r.category, r.confidence) == ("hang_or_timeout", "low")
    assert "py-spy dump" in r.reasoning and "dmesg" in r.reasoning


@pytest.mark.parametrize(
    "after",
    [
        "root@1e2726dafa6a /o/i/u/d/simpledet# \n",  # the shell's prompt is back: it exited
        "(base) user@gpu01:~/proj$ \n",
        "The kernel appears to have died. It will restart automatically.\n",
        "[2025-10-31 05:07:11,062][__main__][ERROR] - Error executing job with overrides: []\n",
        # torch's CUDA IPC and psutil noticing a process that is gone
        "[W CudaIPCTypes.cpp:16] Producer process has been terminated before all shared CUDA "
        "tensors released. See Note [Sharing CUDA tensors]\n",
        "wandb: ERROR Failed to sample metric: psutil.NoSuchProcess process no longer exists "
        "(pid=48)\n",
    ],
)
def test_a_log_that_says_the_process_ended_is_no_hang(ctx, after):
    r = run_skill(diagnose_failure, ctx, {"log_tail": PROGRESS + after})
    assert r.category != "hang_or_timeout", r.reasoning


def test_with_an_exit_status_a_log_that_stops_is_not_called_a_hang(ctx):
    """The daemon always knows the exit status: a run that exited is no hang."""
    r = run_skill(diagnose_failure, ctx, {"log_tail": PROGRESS, "exit_code": 1})
    assert r.category != "hang_or_timeout"


def test_colab_running_out_of_ram_is_host_memory(ctx):
    log = "> Your session crashed after using all available RAM. If you are interested in access "
    log += "to high-RAM runtimes, you may want to check out Colab Pro\n"
    assert run_skill(diagnose_failure, ctx, {"log_tail": log}).category == "host_oom"


def test_tensorflow_warnings_without_their_date_are_warnings(ctx):
    log = (
        "W tensorflow/core/kernels/queue_base.cc:302] _2_FIFOQueueV2: Skipping cancelled "
        "dequeue attempt with queue not closed\n"
    ) * 3
    assert run_skill(diagnose_failure, ctx, {"log_tail": log}).category == "succeeded"


def test_a_bare_bus_error_is_shared_memory(ctx):
    log = "2019-04-16 11:58:14  Creating workers...\nBus error (core dumped)\n"
    r = run_skill(diagnose_failure, ctx, {"log_tail": log})
    assert r.category == "host_oom" and "/dev/shm" in r.reasoning


def test_a_run_that_exited_on_its_own_is_no_hang_by_its_words_either(ctx):
    """The log model may read an odd log's words as a hang's; with an exit status and no signal
    the process ended by itself, and no hang is said."""
    log = (
        "step 1 loss 2.30\nstep 2 loss 2.10\nfrobnicator: lost sync with the widget bus\n"
        "shutting down\n"
    )
    r = run_skill(diagnose_failure, ctx, {"log_tail": log, "exit_code": 1})
    assert r.category != "hang_or_timeout", r.reasoning


def test_the_shells_killed_glued_to_the_progress_line_it_cut_short(ctx):
    """Keras' bar has no newline when the shell prints `Killed`: the word ends the bar's line."""
    log = " 18/500 [>.........] - ETA: 30:36 - loss: 20.9180 - rpn_class_loss: 0.0069Killed\n"
    r = run_skill(diagnose_failure, ctx, {"log_tail": log})
    assert (r.category, r.confidence) == ("host_oom", "medium"), r.reasoning
    tqdm = "train:  41%|████      | 410/1000 [03:12<04:37,  2.13it/s]Killed\n"
    assert run_skill(diagnose_failure, ctx, {"log_tail": tqdm}).category == "host_oom"
    # a word that merely ends in it is not the shell's
    assert run_skill(
        diagnose_failure, ctx, {"log_tail": "step 3 loss 0.2\nUnKilled\n"}
    ).category != ("host_oom")


def test_torchruns_older_summary_is_a_worker_that_failed_not_a_log_that_stops(ctx):
    """torch < 1.10's elastic summary (`Root Cause:`, `msg: "Process failed with exitcode 1"`)
    without the rank's own error: unknown, and the launcher's line shown, never a hang."""
    log = (
        "tools/train.py FAILED\n=======================================\nRoot Cause:\n[0]:\n"
        "  time: 2025-02-20_22:01:20\n  rank: 0 (local_rank: 0)\n  exitcode: 1 (pid: 866229)\n"
        '  error_file: <N/A>\n  msg: "Process failed with exitcode 1"\n'
        "=======================================\n"
    )
    r = run_skill(diagnose_failure, ctx, {"log_tail": log})
    assert r.category == "unknown" and "launcher reports that a worker failed" in r.reasoning
    assert r.evidence and "Process failed with exitcode 1" in r.evidence[-1].text


def test_a_progress_bar_pasted_as_inline_code_is_still_a_bar(ctx):
    """The closing backtick after a bar's `it/s]` read as text the bar ran into: the line's main
    reading became that backtick, and a run stuck at 0 % read as a log with nothing in it."""
    bar = "  0%|          | 0/500000 [00:00<?, ?it/s]"
    plain = run_skill(diagnose_failure, ctx, {"log_tail": bar + "\n"})
    pasted = run_skill(diagnose_failure, ctx, {"log_tail": "`" + bar + "`\n"})
    assert plain.category == pasted.category == "hang_or_timeout", pasted.reasoning


def test_a_segfault_in_the_shells_other_languages_reads_as_one(ctx):
    """bash under zh_CN says `段错误 (核心已转储)` for `Segmentation fault (core dumped)`, and zsh
    `zsh: segmentation fault  cmd`: each read as a log that just stops (a hang)."""
    head = "2025-02-18 19:13:50 INFO trainer:train:544 - 训练数据：102394\n"
    english = run_skill(
        diagnose_failure, ctx, {"log_tail": head + "Segmentation fault (core dumped)\n"}
    )
    for words in (
        "段错误 (核心已转储)",
        "Speicherzugriffsfehler (Speicherabzug geschrieben)",
    ):
        r = run_skill(diagnose_failure, ctx, {"log_tail": head + words + "\n"})
        assert (r.category, r.confidence) == (english.category, english.confidence), r.reasoning
        assert r.category != "hang_or_timeout"
    # zsh names the command after its own words: the log model may weigh those, but the crash
    # is read as one, never as a log that just stops
    r = run_skill(
        diagnose_failure, ctx, {"log_tail": head + "zsh: segmentation fault  python train.py\n"}
    )
    assert r.category != "hang_or_timeout" and "native crash" in r.reasoning, r.reasoning


def test_a_cut_off_traceback_opening_a_joined_path_is_not_a_wait(ctx):
    """`os.path.join(` in the last frame's code read as a thread's join: a traceback pasted
    without its error line, last in `with open(os.path.join(...))`, read as a hang. A thread's
    join or a queue's get there still reads as one."""
    head = (
        "Traceback (most recent call last):\n"
        '  File "train.py", line 65, in train\n'
        "    train_dataset = ShapeNet('data', 'train', params.category)\n"
        '  File "dataset/shapenet.py", line 76, in _load_data\n'
    )
    joined = run_skill(
        diagnose_failure,
        ctx,
        {"log_tail": head + "    with open(os.path.join(self.dataroot, 'train.list')) as f:\n"},
    )
    assert joined.category != "hang_or_timeout", joined.reasoning
    for code in ("    worker.join()\n", "    batch = self._data_queue.get(timeout=timeout)\n"):
        r = run_skill(diagnose_failure, ctx, {"log_tail": head + code})
        assert r.category == "hang_or_timeout", (code, r.reasoning)


def test_an_exhausted_iterator_ends_a_traceback_as_an_error(ctx):
    """`StopIteration` (no `Error` in its name, no message) closing a traceback was not read as
    an exception: a crash pasted as inline code read as a log with no recognised failure."""
    log = (
        "`Traceback (most recent call last):\n"
        'File "domainbed/scripts/train.py", line 211, in <module>\n'
        "for x,_ in next(uda_minibatches_iterator)]\n"
        "StopIteration`\n"
    )
    r = run_skill(diagnose_failure, ctx, {"log_tail": log})
    assert "uncaught exception that matches no known signature: StopIteration" in r.reasoning
    assert r.category not in ("unknown", "hang_or_timeout"), r.reasoning


def test_a_registry_of_hyper_parameter_sets_read_by_a_name_it_lacks(ctx):
    """The rules read the KeyError in a registry lookup as a config naming what is not there;
    the signature is a weak one (a KeyError is as often a bug), so the verdict is the log
    model's, which refits move (the stop-49 refit leans `crashed`): the rules' reading is what
    this pins, and that the verdict stays low-confidence."""
    log = (
        '  File "hparams/registry.py", line 20, in get_hparams\n    curr = _HPARAMS[name]\n'
        "KeyError: 'data/tmp/vocab_200'\n"
    )
    r = run_skill(diagnose_failure, ctx, {"log_tail": log})
    assert "the signatures alone: the config lacks a key the code reads" in r.reasoning, r.reasoning
    assert r.category in ("config_error", "crashed") and r.confidence == "low", r.reasoning
