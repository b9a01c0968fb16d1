package leakcheck

import (
	"testing"
)

func TestLeaked(t *testing.T) {
	stacks := "goroutine 1 [running]:\nmain.main()\n\ngoroutine 7 [select]:\ngithub.com/comfypool/comfypool/comfy.(*session).manage(...)\n"
	if !leaked(stacks, []string{"comfy.(*session)"}) {
		t.Error("a session goroutine is a leak")
	}
	if leaked(stacks, []string{"comfy/comfytest.(*"}) {
		t.Error("no comfytest goroutine: no leak")
	}
	own := "goroutine 1 [running]:\ngithub.com/comfypool/comfypool/internal/leakcheck.Main(...)\ncomfypool/files_test.TestMain(...)\n"
	if leaked(own, []string{"comfypool/files"}) {
		t.Error("the goroutine running Main is not a leak")
	}
}

func TestWaitSeesAGoroutineExit(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); leakcheckHeldGoroutine(started, release) }()
	<-started
	if _, ok := wait([]string{"leakcheckHeldGoroutine"}, 3); ok {
		t.Fatal("a held goroutine went unseen")
	}
	close(release)
	<-done
	if stacks, ok := wait([]string{"leakcheckHeldGoroutine"}, 100); !ok {
		t.Fatalf("an exited goroutine is still reported:\n%s", stacks)
	}
}

//go:noinline
func leakcheckHeldGoroutine(started, release chan struct{}) {
	close(started)
	<-release
}
