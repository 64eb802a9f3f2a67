"""``python session_writer.py <how> <file>``: a process that starts a writer (a line to ``file``
every 50 ms) in a process group of its own, in its session, as a local Ray cluster's raylet starts
its workers, prints the writer's pid, then waits (``wait``), or kills its own session (``suicide``,
as a superseded attempt does), or starts a Ray actor that writes (``ray``)."""

import os
import subprocess
import sys
import time

WRITE_FOREVER = "import sys, time\nwhile True:\n    open(sys.argv[1], 'a').write('x\\n'); time.sleep(0.05)\n"


def main(how: str, path: str) -> None:
    if how == "ray":
        import ray

        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)

        @ray.remote
        class Writer:
            def pid(self) -> int:
                return os.getpid()

            def write_forever(self, path: str) -> None:
                while True:
                    with open(path, "a") as out:
                        out.write("x\n")
                    time.sleep(0.05)

        writer = Writer.options(max_concurrency=2).remote()
        pid = ray.get(writer.pid.remote())
        writer.write_forever.remote(path)
    else:
        pid = subprocess.Popen([sys.executable, "-c", WRITE_FOREVER, path], process_group=0).pid
    while not os.path.exists(path):
        time.sleep(0.05)
    print(pid, flush=True)
    if how == "suicide":
        sys.path.insert(0, os.getcwd())
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
        from workers.processes import kill_own_session

        time.sleep(0.5)
        kill_own_session()
    time.sleep(600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
