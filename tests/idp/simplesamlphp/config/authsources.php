<?php
/*
 * Authentication sources: `admin` (SimpleSAMLphp's admin pages) and `test-users`, an
 * exampleauth:UserPass source with the users from settings.json ('username:password' => attributes).
 */

$settings = json_decode(file_get_contents(__DIR__ . '/settings.json'), true, 512, JSON_THROW_ON_ERROR);

$config = [
    'admin' => ['core:AdminPassword'],
    'test-users' => array_merge(['exampleauth:UserPass'], $settings['users']),
];
