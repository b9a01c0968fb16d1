package sharedexample

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

var (
	drivenLine  = regexp.MustCompile(`(?m)^  (gpu-\d+) is driven by (\S+)$`)
	ranLine     = regexp.MustCompile(`(?m)^job +(\d+) ran in (\S+) on (\S+)$`)
	summaryLine = regexp.MustCompile(`(?m)^(\d+) jobs in \S+: (.*); Wait in this process returned (\d+) results$`)
	ranCount    = regexp.MustCompile(`^(\S+) ran (\d+)$`)
)

// CheckOutput checks the standard output of an enqueuer that ran jobs
// jobs on the four fake backends: the backend leases shared two and two
// between the workers; every job run exactly once, in a worker that held
// the backend it ran on, and each worker running some; a summary that
// agrees; the workers stopped. It returns what is wrong, or nil. The
// adapter modules' tests run the example and call it.
func CheckOutput(out string, jobs int) error {
	var errs []error
	holder := map[string]string{} // backend -> worker, from the lease table
	held := map[string]int{}      // worker -> backends
	for _, m := range drivenLine.FindAllStringSubmatch(out, -1) {
		holder[m[1]] = m[2]
		held[m[2]]++
	}
	for _, name := range workerNames {
		if held[name] != 2 {
			errs = append(errs, fmt.Errorf("%s drives %d backends, want 2", name, held[name]))
		}
	}
	if len(holder) != 4 {
		errs = append(errs, fmt.Errorf("the lease table lists %d backends, want 4", len(holder)))
	}

	ran := map[int]bool{}
	perWorker := map[string]int{}
	for _, m := range ranLine.FindAllStringSubmatch(out, -1) {
		i, _ := strconv.Atoi(m[1])
		worker, backend := m[2], m[3]
		if ran[i] {
			errs = append(errs, fmt.Errorf("job %d ran twice", i))
		}
		ran[i] = true
		perWorker[worker]++
		if holder[backend] != worker {
			errs = append(errs, fmt.Errorf("job %d ran in %s on %s, which %q drives", i, worker, backend, holder[backend]))
		}
	}
	for i := range jobs {
		if !ran[i] {
			errs = append(errs, fmt.Errorf("job %d did not run", i))
		}
	}
	if len(ran) != jobs {
		errs = append(errs, fmt.Errorf("%d jobs ran, want %d", len(ran), jobs))
	}
	for _, name := range workerNames {
		if perWorker[name] == 0 {
			errs = append(errs, fmt.Errorf("%s ran no job", name))
		}
	}

	if m := summaryLine.FindStringSubmatch(out); m == nil {
		errs = append(errs, errors.New("no summary line"))
	} else {
		if m[1] != strconv.Itoa(jobs) || m[3] != strconv.Itoa(jobs) {
			errs = append(errs, fmt.Errorf("the summary says %s jobs and %s results, want %d", m[1], m[3], jobs))
		}
		for _, part := range strings.Split(m[2], ", ") {
			c := ranCount.FindStringSubmatch(part)
			if c == nil || c[2] != strconv.Itoa(perWorker[c[1]]) {
				errs = append(errs, fmt.Errorf("the summary says %q, the job lines %v", part, perWorker))
			}
		}
	}
	if !strings.Contains(out, "\nstopping the workers\n") {
		errs = append(errs, errors.New("the workers were not stopped"))
	}
	return errors.Join(errs...)
}
