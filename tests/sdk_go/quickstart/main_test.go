package main

// The quick start of docs/quickstart.md (main.go is its Go example, verbatim) run against
// busd: what it prints is what the page promises.

import (
	"io"
	"os"
	"testing"
)

func TestQuickStart(t *testing.T) {
	if os.Getenv("SERVICEBUS_CONNECTION_STRING") == "" {
		t.Fatal("SERVICEBUS_CONNECTION_STRING is not set: run this tier through tests/sdk_go/test_go_sdk.py")
	}
	read, write, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout := os.Stdout
	os.Stdout = write
	printed := make(chan string)
	go func() {
		text, _ := io.ReadAll(read)
		printed <- string(text)
	}()
	func() {
		defer func() { os.Stdout = stdout; write.Close() }()
		main()
	}()
	want := "order-42 step 0\norder-42 step 1\norder-42 step 2\nactive: 0\n"
	if got := <-printed; got != want {
		t.Fatalf("the quick start printed %q, want %q", got, want)
	}
}
