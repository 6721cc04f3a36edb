# JupyterHub for the course: each student's server is a Slurm job (batchspawner's SlurmSpawner) that runs
# as the student, with the kit's kernel, and submits the course's jobs to the same cluster.
# scripts/jupyterhub/start.sh runs `jupyterhub -f` on this file with the DLOKIT_HUB_* variables below;
# copy it and edit the copy for your site (docs/instructors.md, "JupyterHub on Slurm").
import os
import shlex
from pathlib import Path

import batchspawner
from traitlets import Unicode

c = get_config()  # noqa: F821 (given by JupyterHub)


def setting(name, default=None):
    value = os.environ.get(name, default)
    if value is None:
        raise SystemExit(f"jupyterhub_config.py: set {name} (scripts/jupyterhub/start.sh does)")
    return value


HUB_DIR = Path(setting("DLOKIT_HUB_DIR"))  # the hub's database, cookie secret, pid files
VENV = Path(setting("DLOKIT_HUB_VENV"))  # jupyterhub, batchspawner, JupyterLab and the kit, readable by all
PROFILES = setting("DLOKIT_HUB_PROFILES", str(Path(__file__).with_name("hub_profiles.toml")))
CLASS_DIR = Path(setting("DLOKIT_HUB_CLASS_DIR"))  # the class's run records and race leaderboard (setup.sh)

# --- where the hub listens --------------------------------------------------------------------------------
c.JupyterHub.bind_url = f"http://{setting('DLOKIT_HUB_IP', '127.0.0.1')}:{setting('DLOKIT_HUB_PORT', '8000')}"
# the servers call the hub's API from their node: on a real cluster use an address the nodes reach
API_ADDRESS = f"{setting('DLOKIT_HUB_API_IP', '127.0.0.1')}:{setting('DLOKIT_HUB_API_PORT', '8081')}"
c.JupyterHub.hub_bind_url = f"http://{API_ADDRESS}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{setting('DLOKIT_HUB_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.command = [str(VENV / "bin" / "configurable-http-proxy")]  # the Python one, from PyPI
c.ConfigurableHTTPProxy.pid_file = str(HUB_DIR / "proxy.pid")
c.JupyterHub.pid_file = str(HUB_DIR / "jupyterhub.pid")
c.JupyterHub.db_url = f"sqlite:///{HUB_DIR / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(HUB_DIR / "jupyterhub_cookie_secret")
c.Application.log_level = "INFO"  # DEBUG would write the servers' API tokens to the log
c.JupyterHub.cleanup_servers = False  # restarting the hub leaves the students' servers (jobs) running

# --- who may log in: Unix accounts (PAM) in the course's group ------------------------------------------
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.allowed_groups = {setting("DLOKIT_HUB_GROUP", "dlokit")}
c.Authenticator.admin_users = {name for name in setting("DLOKIT_HUB_ADMINS", "").split(",") if name}


# --- each server is a Slurm job of its student --------------------------------------------------------------
class SlurmSpawner(batchspawner.SlurmSpawner):
    """Servers listen on DLOKIT_HUB_SERVER_IP. 127.0.0.1 (default) suits a Slurm whose nodes all run on
    this machine (scripts/local_slurm, one node or several): the hub reaches every server there, while the
    node names (node1, node2...) do not resolve here. On a real cluster set 0.0.0.0: the hub then reaches
    each server at its node's name, as squeue gives it."""

    ip = Unicode(setting("DLOKIT_HUB_SERVER_IP", "127.0.0.1"))  # start() listens on this trait's default

    def state_gethost(self):
        node = super().state_gethost()
        return node if self.ip in ("", "0.0.0.0") else self.ip


c.JupyterHub.spawner_class = SlurmSpawner
c.SlurmSpawner.exec_prefix = "runuser -u {username} --"  # sbatch/squeue/scancel as the student (hub is root)
c.SlurmSpawner.req_partition = setting("DLOKIT_HUB_PARTITION", "")  # empty: the cluster's default
c.SlurmSpawner.req_runtime = setting("DLOKIT_HUB_RUNTIME", "")  # empty: the partition's limit
# absolute commands: the job's PATH is the hub's, not the venv's (quoted: they go into the batch script)
c.SlurmSpawner.batchspawner_singleuser_cmd = shlex.quote(str(VENV / "bin" / "batchspawner-singleuser"))
c.Spawner.cmd = [shlex.quote(str(VENV / "bin" / "jupyterhub-singleuser"))]
# python, jupyter, the kit's CLI on PATH; files in the class folder writable by the course's group
c.SlurmSpawner.req_prologue = f"export PATH={shlex.quote(str(VENV / 'bin'))}:$PATH; umask 0002"
c.Spawner.default_url = "/lab"
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 60
# SLURM_CONF: the notebook's sbatch/squeue talk to the same cluster
c.Spawner.env_keep = ["PATH", "LANG", "LC_ALL", "SLURM_CONF"]
c.Spawner.environment = {
    "DLOKIT_PROFILE": setting("DLOKIT_HUB_PROFILE", "local-slurm"),  # dlokit.use_profile() without a name
    "DLOKIT_PROFILES": PROFILES,  # the hub's settings of that profile (see the file)
    # one folder for the class: the leaderboard (<runs>/leaderboard) and the class report see every student
    "DLOKIT_RUNS_DIR": str(CLASS_DIR / "runs"),
}
