"""Print the pre-made PersistentVolumes of the test cluster (a YAML stream for kubectl apply).

No provisioner runs here, so every claim binds to one of these. Each offers every access mode
(but ReadWriteOncePod, which must stand alone), so that the claim's own mode is what the tests
exercise; they are Retain, and plenty.
"""

import json
import sys

ROOT = sys.argv[1]
COUNT = 30
CLASSES = ("standard", "standard-rwx")

for cls in CLASSES:
    for i in range(COUNT):
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{cls}-{i:02d}", "labels": {"pagoda.dev/test-volume": cls}},
            "spec": {
                "storageClassName": cls,
                "capacity": {"storage": "2Ti"},
                "accessModes": ["ReadWriteOnce", "ReadWriteMany", "ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "hostPath": {"path": f"{ROOT}/{cls}-{i:02d}", "type": "DirectoryOrCreate"},
            },
        }
        print("---")
        print(json.dumps(pv))
