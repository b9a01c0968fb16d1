-- The job queue's tables (written by the queue driver's author).
SELECT 1;
