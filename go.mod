module github.com/streamd/streamd

go 1.26.0

require golang.org/x/sys v0.50.0

require go.uber.org/goleak v1.3.0
