"""OpenStack Cinder's SPDK volume driver and its spdk-nvmeof target helper,
instantiated with a minimal oslo configuration (no Cinder services, no
database), against blockwire's --rpc-http endpoint.

Usage: cinder_session.py RPC_PORT USER PASSWORD NVME_PORT
Each step prints one JSON line ({"step": ..., ...}); after an export it
waits for a line on stdin (the test reads and writes the namespace with
blockwire's initiator meanwhile). Every JSON-RPC call the driver makes is
printed too ({"call": method, "params": ..., "result": ...}).
"""
import json
import sys
import uuid

import requests
from oslo_config import cfg

from cinder.volume import configuration as conf
from cinder.volume import driver
from cinder.volume.drivers import spdk
from cinder.volume.targets import spdknvmf

rpc_port, user, password, nvme_port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])


def say(**kw):
    print(json.dumps(kw), flush=True)


# Every call the driver and its target helper make, with its answer.
_post = requests.post


def traced_post(url, data=None, **kw):
    r = _post(url, data=data, **kw)
    req = json.loads(data)
    try:
        body = r.json()
    except ValueError:
        body = r.text
    say(call=req["method"], params=req.get("params"), status=r.status_code, answer=body)
    return r


requests.post = traced_post

cfg.CONF([], project="cinder", default_config_files=[])
group = "blockwire"
configuration = conf.Configuration(driver.volume_opts, config_group=group)
for opts in (driver.nvmeof_opts, driver.nvmet_opts, spdknvmf.spdk_opts):
    configuration.append_config_values(opts)
for k, v in {
    "target_helper": "spdk-nvmeof",
    "target_protocol": "nvmet_tcp",
    "target_ip_address": "127.0.0.1",
    "target_port": nvme_port,
    "target_prefix": "nqn.2016-06.io.spdk",
    "nvmet_ns_id": 1,
    "spdk_rpc_ip": "127.0.0.1",
    "spdk_rpc_port": int(rpc_port),
    "spdk_rpc_username": user,
    "spdk_rpc_password": password,
    "spdk_rpc_protocol": "http",
}.items():
    cfg.CONF.set_override(k, v, group=group)


class Obj(dict):
    """What the driver reads of a volume or snapshot: items and attributes."""

    def __getattr__(self, k):
        return self[k]


def volume(size):
    i = str(uuid.uuid4())
    return Obj(id=i, name="volume-" + i, size=size, provider_location=None)


drv = spdk.SPDKDriver(configuration=configuration)
drv.do_setup(None)
drv.check_for_setup_error()
drv._update_volume_stats()
say(step="stats", pools=drv._stats["pools"])

vol = volume(1)
drv.create_volume(vol)
vol["provider_location"] = drv.create_export(None, vol, None)["provider_location"]
say(step="exported", volume=vol.name, connection=drv.initialize_connection(vol, {"nqn": "nqn.2014-08.org.nvmexpress:uuid:" + str(uuid.uuid4())}))
sys.stdin.readline()

snap = Obj(id=str(uuid.uuid4()), volume=vol, volume_size=1)
snap["name"] = "snapshot-" + snap["id"]
drv.create_snapshot(snap)
say(step="snapshot", name=snap.name)
sys.stdin.readline()

copy = volume(2)
drv.create_volume_from_snapshot(copy, snap)
copy["provider_location"] = drv.create_export(None, copy, None)["provider_location"]
say(step="exported", volume=copy.name, connection=drv.initialize_connection(copy, {"nqn": "nqn.2014-08.org.nvmexpress:uuid:" + str(uuid.uuid4())}))
sys.stdin.readline()

drv.remove_export(None, copy)
drv.remove_export(None, vol)
drv.delete_volume(copy)
drv.delete_snapshot(snap)
drv.delete_volume(vol)
say(step="deleted", bdevs=drv._rpc_call("bdev_get_bdevs"), subsystems=drv._rpc_call("nvmf_get_subsystems"))
