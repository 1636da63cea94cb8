package main

import (
	"fmt"
	"os"
	"time"

	"k8s.io/kubernetes/pkg/controller/job"
)

// jobPodBackoffVar names the Job controller's first back-off after a failed pod (a Go duration;
// doubled per failure, as Kubernetes does). Kubernetes waits 10 s, then 20 s, before each
// replacement pod, and has no flag for it; the tests fail loader pods on purpose and need not wait
// that out, so up.sh sets it. The variable is the one Kubernetes exports for its own tests.
const jobPodBackoffVar = "PAGODA_KUBE_JOB_POD_BACKOFF"

func tuneJobController() error {
	value := os.Getenv(jobPodBackoffVar)
	if value == "" {
		return nil
	}
	backoff, err := time.ParseDuration(value)
	if err != nil || backoff <= 0 {
		return fmt.Errorf("%s=%q: want a positive Go duration such as 1s", jobPodBackoffVar, value)
	}
	job.DefaultJobPodFailureBackOff = backoff
	return nil
}
